"""`create_app`: builds the FastAPI app (state, lifespan, middleware order, routers). Nothing else.

Middleware, outer to inner: request id → telemetry (latency metrics, the HTTP span) →
(security middleware go here: CORS → audit → authn → rate limit, DESIGN.md §4) →
body-size limit → catch-all 500 → FastAPI's exception handlers → routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider

from inferflux import __version__
from inferflux.api import debug, health, metrics, stats
from inferflux.api.admin import adapters as admin_adapters
from inferflux.api.admin import models as admin_models
from inferflux.api.deps import ServingState
from inferflux.api.errors import CatchAllMiddleware, install_error_handlers
from inferflux.api.middleware import BodySizeLimitMiddleware, RequestIdMiddleware
from inferflux.api.model_loader import EngineFactory, EngineModelLoader
from inferflux.api.model_manager import ModelManager
from inferflux.api.model_slot import ModelSlot, build_serving, system_fingerprint
from inferflux.api.native import chat as native_chat
from inferflux.api.native import embeddings as native_embeddings
from inferflux.api.native import generate as native_generate
from inferflux.api.native.protocol import NativeStreamEvent
from inferflux.api.ollama import router as ollama_router
from inferflux.api.openai import chat, completions, embeddings, tokenize
from inferflux.api.openai import models as openai_models
from inferflux.api.openapi import install_openapi
from inferflux.api.telemetry import TelemetryMiddleware, make_telemetry
from inferflux.config.settings import Settings
from inferflux.engine.client import make_engine_client
from inferflux.engine.model_registry import RegistryPlan, single_model_plan
from inferflux.engine.model_spec import model_settings
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer
from inferflux.errors import InferfluxError

logger = logging.getLogger(__name__)

__all__ = ["create_app", "system_fingerprint"]


def create_app(
    settings: Settings,
    *,
    engine: EngineClient,
    tokenizer: Tokenizer,
    model_info: ModelInfo,
    tracer_provider: TracerProvider | None = None,
    registry: RegistryPlan | None = None,
    engines: EngineFactory = make_engine_client,
) -> FastAPI:
    """The InferFlux HTTP app. Its lifespan starts the models' engines and stops them.

    `engine`, `tokenizer` and `model_info` are the default model's (its engine not started
    yet); `registry` lists the other models and where new ones may come from (None: the
    default model alone, admin loads resolving in its folder). `engines` builds the engine
    client of every model loaded later. Routes see each engine wrapped in an
    `ObservedEngine` (metrics, traces, /debug). `tracer_provider` replaces the one
    `observability.tracing` describes (tests). Raises ModelLoadError when the chat
    template (the GGUF's, or `model.chat_template`) does not compile.
    """
    app = FastAPI(title="InferFlux", version=__version__, lifespan=_lifespan)
    plan = registry or single_model_plan(
        settings, Path(model_info.path), model_info.model_id, model_info.aliases
    )
    models: ModelManager | None = None
    telemetry = make_telemetry(
        settings, lambda: models.workers() if models else [], model_info, tracer_provider
    )
    app.state.telemetry = telemetry
    serving = build_serving(
        model_settings(settings, plan.default), engine, tokenizer, model_info, telemetry
    )
    app.state.serving = serving
    models = ModelManager(
        settings.registry,
        plan,
        ModelSlot(plan.default, serving, close=getattr(tokenizer, "close", None)),
        EngineModelLoader(settings, telemetry, engines),
        on_default=lambda current: setattr(app.state, "serving", current),
    )
    app.state.models = models
    _include_routers(app)
    install_openapi(app, event_models=[NativeStreamEvent])
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.server.max_request_bytes)
    app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    app.add_middleware(RequestIdMiddleware)
    return app


def _include_routers(app: FastAPI) -> None:
    install_error_handlers(app)
    for router in (
        health.router,
        stats.router,
        metrics.router,
        debug.router,
        chat.router,
        completions.router,
        openai_models.router,
        tokenize.router,
        native_generate.router,
        native_chat.router,
        embeddings.router,
        native_embeddings.router,
        ollama_router,
        # NOTE(#6): admin routes; the security layer attaches require_scope(Scope.ADMIN)
        # to admin_models and require_scope(Scope.ADAPTER_MANAGER) to admin_adapters.
        admin_models.router,
        admin_adapters.router,
    ):
        app.include_router(router)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the engines in the background so /livez answers (and /readyz says 503)
    while the default model loads; stop every model's engine on exit."""
    models: ModelManager = app.state.models
    app.state.engine_start_error = None
    logger.info("starting the engine for %s", app.state.serving.model_info.model_id)
    starting = asyncio.create_task(_start_engine(app, models), name="engine-start")
    try:
        yield
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await models.shutdown()
        app.state.telemetry.shutdown()


async def _start_engine(app: FastAPI, models: ModelManager) -> None:
    """Wait for the default model's first ready worker (the other models then load in
    the background). If none can start, record why on `app.state.engine_start_error` and
    call `app.state.request_shutdown` when the runner set one (`inferflux serve` does, and
    then exits 1)."""
    try:
        await models.start()
    except InferfluxError as exc:
        app.state.engine_start_error = exc.message
        logger.error("the engine could not start: %s; shutting down", exc.message)
        request_shutdown = getattr(app.state, "request_shutdown", None)
        if request_shutdown is not None:
            request_shutdown()
        return
    # NOTE: read from app.state, never kept: a swapped-out model must be collectable
    serving: ServingState = app.state.serving
    logger.info(
        "ready: serving %s (n_ctx %d, %s chat template)",
        serving.model_info.model_id,
        serving.model_info.n_ctx,
        "fallback" if serving.chat_template.is_fallback else "the model's",
    )
