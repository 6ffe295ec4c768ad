"""`create_app`: builds the FastAPI app (state, lifespan, middleware order, routers). Nothing else.

Middleware, outer to inner: request id → telemetry (latency metrics, the HTTP span) →
security (CORS → audit → authn → rate limit, DESIGN.md §4; `api/security_setup.py`) →
body-size limit → catch-all 500 → FastAPI's exception handlers → routes.

Routes see the engine as `GuardedEngine(ObservedEngine(engine))`: security policy
(tenant cache namespace, token limits, guardrails, audit record) outside, observation
inside (a request refused by policy never reaches the metrics of generations).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider

from inferflux import __version__
from inferflux.api import debug, health, metrics, stats
from inferflux.api.deps import ServingState
from inferflux.api.errors import CatchAllMiddleware, install_error_handlers
from inferflux.api.guarded_engine import GuardedEngine
from inferflux.api.middleware import BodySizeLimitMiddleware, RequestIdMiddleware
from inferflux.api.native import chat as native_chat
from inferflux.api.native import embeddings as native_embeddings
from inferflux.api.native import generate as native_generate
from inferflux.api.native.protocol import NativeStreamEvent
from inferflux.api.observed_engine import ObservedEngine
from inferflux.api.ollama import router as ollama_router
from inferflux.api.openai import chat, completions, embeddings, models, tokenize
from inferflux.api.openapi import install_openapi
from inferflux.api.security_setup import install_security_middleware, make_security_layer
from inferflux.api.telemetry import TelemetryMiddleware, make_telemetry
from inferflux.config.settings import Settings
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler, grammar_limits
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer
from inferflux.errors import InferfluxError
from inferflux.security.policy import PolicySource

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    engine: EngineClient,
    tokenizer: Tokenizer,
    model_info: ModelInfo,
    tracer_provider: TracerProvider | None = None,
    policy_source: PolicySource | None = None,
) -> FastAPI:
    """The InferFlux HTTP app. Its lifespan starts the engine and shuts it down on exit.

    Routes see `engine` wrapped in an `ObservedEngine` (metrics, traces, /debug).
    `tracer_provider` replaces the one `observability.tracing` describes (tests);
    `policy_source` the policy built from settings alone.
    Raises ModelLoadError when the chat template (the GGUF's, or `model.chat_template`)
    does not compile.
    """
    chat_template = ChatTemplate.from_model(
        settings.model.chat_template or tokenizer.chat_template,
        model_info.architecture,
        tokenizer.bos_text,
        tokenizer.eos_text,
    )
    app = FastAPI(title="InferFlux", version=__version__, lifespan=_lifespan)
    telemetry = make_telemetry(settings, engine, model_info, tracer_provider)
    app.state.telemetry = telemetry
    security = make_security_layer(settings, telemetry.metrics, policy_source)
    app.state.security = security
    guarded = GuardedEngine(
        ObservedEngine(engine, telemetry, model_info.model_id),
        tokenizer=tokenizer,
        model=model_info.model_id,
        source=security.source,
        limits=security.limits,
        guardrails=security.guardrails,
    )
    app.state.serving = ServingState(
        settings=settings,
        engine=guarded,
        tokenizer=tokenizer,
        model_info=model_info,
        chat_template=chat_template,
        constraints=ConstraintCompiler(tokenizer.constraint_error, grammar_limits(settings)),
        system_fingerprint=system_fingerprint(model_info),
        started_at=time.monotonic(),
    )
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(stats.router)
    app.include_router(metrics.router)
    app.include_router(debug.router)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(models.router)
    app.include_router(tokenize.router)
    app.include_router(native_generate.router)
    app.include_router(native_chat.router)
    app.include_router(embeddings.router)
    app.include_router(native_embeddings.router)
    app.include_router(ollama_router)
    install_openapi(app, event_models=[NativeStreamEvent])
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.server.max_request_bytes)
    install_security_middleware(app, security)
    app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    app.add_middleware(RequestIdMiddleware)
    return app


def system_fingerprint(model_info: ModelInfo) -> str:
    """OpenAI's `system_fingerprint`: changes when the server version or model file does."""
    key = f"{__version__}|{model_info.model_id}|{model_info.size_bytes}|{model_info.created}"
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the engine in the background so /livez answers (and /readyz says 503)
    while the model loads; stop it on exit."""
    serving: ServingState = app.state.serving
    app.state.engine_start_error = None
    logger.info("starting the engine for %s", serving.model_info.model_id)
    starting = asyncio.create_task(_start_engine(app, serving), name="engine-start")
    try:
        yield
    finally:
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await serving.engine.shutdown()
        await app.state.security.aclose()
        app.state.telemetry.shutdown()


async def _start_engine(app: FastAPI, serving: ServingState) -> None:
    """Wait for the first ready worker. If none can start, record why on
    `app.state.engine_start_error` and call `app.state.request_shutdown` when the runner
    set one (`inferflux serve` does, and then exits 1)."""
    try:
        await serving.engine.start()
    except InferfluxError as exc:
        app.state.engine_start_error = exc.message
        logger.error("the engine could not start: %s; shutting down", exc.message)
        request_shutdown = getattr(app.state, "request_shutdown", None)
        if request_shutdown is not None:
            request_shutdown()
        return
    logger.info(
        "ready: serving %s (n_ctx %d, %s chat template)",
        serving.model_info.model_id,
        serving.model_info.n_ctx,
        "fallback" if serving.chat_template.is_fallback else "the model's",
    )
