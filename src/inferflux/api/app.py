"""`create_app`: builds the FastAPI app (state, lifespan, middleware order, routers). Nothing else.

Middleware, outer to inner: request id → telemetry (latency metrics, the HTTP span) →
CORS → audit → authentication → rate limit (DESIGN.md §4; `api/security_stack.py`) →
body-size limit → catch-all 500 → FastAPI's exception handlers → routes.

Every router is included with the scope its routes need (`_ROUTERS`); only the health
probes (and /metrics when public) have none, and a test fails any route that lacks one.
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

from fastapi import APIRouter, FastAPI
from opentelemetry.sdk.trace import TracerProvider

from inferflux import __version__
from inferflux.api import admin, debug, health, metrics, stats
from inferflux.api.deps import ServingState
from inferflux.api.errors import CatchAllMiddleware, install_error_handlers
from inferflux.api.guarded_engine import GuardedEngine
from inferflux.api.middleware import BodySizeLimitMiddleware, RequestIdMiddleware
from inferflux.api.native import chat as native_chat
from inferflux.api.native import embeddings as native_embeddings
from inferflux.api.native import generate as native_generate
from inferflux.api.native.protocol import NativeStreamEvent
from inferflux.api.observed_engine import ObservedEngine
from inferflux.api.ollama import chat as ollama_chat
from inferflux.api.ollama import embed as ollama_embed
from inferflux.api.ollama import generate as ollama_generate
from inferflux.api.ollama import models as ollama_models
from inferflux.api.openai import chat, completions, embeddings, models, tokenize
from inferflux.api.openapi import install_openapi
from inferflux.api.security_setup import make_security_layer
from inferflux.api.security_stack import SecurityState, build_security, install_security
from inferflux.api.telemetry import TelemetryMiddleware, make_telemetry
from inferflux.config.settings import Settings
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler, grammar_limits
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer
from inferflux.errors import InferfluxError
from inferflux.security.policy import PolicySource
from inferflux.security.principal import Scope
from inferflux.security.rbac import require_scope

logger = logging.getLogger(__name__)

# Every router and the scope its routes need (None: public, see `security_stack`).
_ROUTERS: tuple[tuple[APIRouter, Scope | None], ...] = (
    (health.router, None),
    (stats.router, Scope.READ),
    (debug.router, Scope.ADMIN),
    (chat.router, Scope.GENERATE),
    (completions.router, Scope.GENERATE),
    (models.router, Scope.READ),
    (tokenize.router, Scope.GENERATE),
    (native_generate.router, Scope.GENERATE),
    (native_chat.router, Scope.GENERATE),
    (embeddings.router, Scope.GENERATE),
    (native_embeddings.router, Scope.GENERATE),
    (ollama_generate.router, Scope.GENERATE),
    (ollama_chat.router, Scope.GENERATE),
    (ollama_embed.router, Scope.GENERATE),
    (ollama_models.router, Scope.READ),
    (admin.router, Scope.ADMIN),
)


def create_app(
    settings: Settings,
    *,
    engine: EngineClient,
    tokenizer: Tokenizer,
    model_info: ModelInfo,
    tracer_provider: TracerProvider | None = None,
    security: SecurityState | None = None,
    policy_source: PolicySource | None = None,
) -> FastAPI:
    """The InferFlux HTTP app. Its lifespan starts the engine and shuts it down on exit.

    Routes see `engine` wrapped in an `ObservedEngine` (metrics, traces, /debug).
    `tracer_provider` replaces the one `observability.tracing` describes (tests).
    `security` is built from `settings` when not given (`inferflux serve` builds it first,
    so a bad policy store fails before the model loads); `policy_source` replaces its
    policy (tests that change the policy directly). Raises ModelLoadError when the
    chat template (the GGUF's, or `model.chat_template`) does not compile, PolicyStoreError
    when the policy store cannot be read.
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
    access = security or build_security(settings)
    layer = make_security_layer(settings, telemetry.metrics, policy_source or access.policy)
    guarded = GuardedEngine(
        ObservedEngine(engine, telemetry, model_info.model_id),
        tokenizer=tokenizer,
        model=model_info.model_id,
        source=layer.source,
        limits=layer.limits,
        guardrails=layer.guardrails,
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
    _include_routers(app, settings)
    install_openapi(app, event_models=[NativeStreamEvent])
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.server.max_request_bytes)
    install_security(app, settings, access, layer)
    app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    app.add_middleware(RequestIdMiddleware)
    return app


def _include_routers(app: FastAPI, settings: Settings) -> None:
    for router, scope in _ROUTERS:
        app.include_router(router, dependencies=[require_scope(scope)] if scope else None)
    public_metrics = metrics.is_public(settings)
    app.include_router(
        metrics.router, dependencies=None if public_metrics else [require_scope(Scope.READ)]
    )


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
        await app.state.security_layer.aclose()
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
