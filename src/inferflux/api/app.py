"""`create_app`: builds the FastAPI app (state, lifespan, middleware order, routers). Nothing else.

Middleware, outer to inner: request id (the request's `RequestContext`) → telemetry
(latency metrics, the HTTP span) → drain (503 while shutting down, `api/drain.py`) →
CORS → audit → authentication → rate limit (`api/security_layer.py`) → body-size limit
→ catch-all 500 → trailing slashes stripped (no redirects) → FastAPI's exception
handlers → routes.

Every router is included with the scope its routes need (`_ROUTERS`); only the health
probes (and /metrics when public) have none, and a test fails any route that lacks one.
The API sees each model's engine as `GuardedEngine(ObservedEngine(engine))`: security
policy (tenant cache namespace, token limits, guardrails, the request's record) outside,
observation inside (a request refused by policy never reaches the metrics of
generations). With `server.grpc_port` set, the lifespan also runs the gRPC frontend
(`api/grpc`), a bridge that sends each call through this same app. The models
themselves (the default one, the catalog's others, hot swap)
belong to the `ModelHub`; everything the app holds is one typed `AppState`
(`api/state.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI
from opentelemetry.sdk.trace import TracerProvider

from inferflux import __version__
from inferflux.api import admin, debug, health, metrics, stats
from inferflux.api.admin import adapters as admin_adapters
from inferflux.api.admin import models as admin_models
from inferflux.api.anthropic import messages as anthropic_messages
from inferflux.api.config_sync import make_config_sync
from inferflux.api.console import console_router
from inferflux.api.drain import DrainMiddleware
from inferflux.api.errors import CatchAllMiddleware, install_error_handlers
from inferflux.api.generation import GenerationService
from inferflux.api.guarded_engine import GuardedEngine
from inferflux.api.live_config import LiveConfig
from inferflux.api.lmstudio import models as lmstudio_models
from inferflux.api.lmstudio import routes as lmstudio_routes
from inferflux.api.middleware import (
    BodySizeLimitMiddleware,
    RequestIdMiddleware,
    TrailingSlashMiddleware,
)
from inferflux.api.model_sync import make_model_sync
from inferflux.api.native import chat as native_chat
from inferflux.api.native import embeddings as native_embeddings
from inferflux.api.native import generate as native_generate
from inferflux.api.native.protocol import NativeStreamEvent
from inferflux.api.observed_engine import ObservedEngine
from inferflux.api.ollama import blobs as ollama_blobs
from inferflux.api.ollama import chat as ollama_chat
from inferflux.api.ollama import embed as ollama_embed
from inferflux.api.ollama import generate as ollama_generate
from inferflux.api.ollama import manage as ollama_manage
from inferflux.api.ollama import models as ollama_models
from inferflux.api.ollama import pull as ollama_pull
from inferflux.api.openai import chat, completions, embeddings, tokenize
from inferflux.api.openai import models as openai_models
from inferflux.api.openapi import install_openapi
from inferflux.api.pools import takes_requests
from inferflux.api.response_store import ResponseStore
from inferflux.api.responses import routes as responses_routes
from inferflux.api.responses import socket as responses_socket
from inferflux.api.security_layer import (
    SecurityLayer,
    SecurityState,
    build_security,
    install_security,
    make_security_layer,
)
from inferflux.api.state import AppState, app_state, attach_state
from inferflux.api.telemetry import Telemetry, TelemetryMiddleware, make_telemetry
from inferflux.config.settings import Settings
from inferflux.engine.client import make_engine_client
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer
from inferflux.errors import ConfigError, InferfluxError
from inferflux.models.catalog import Catalog, single_model_catalog
from inferflux.models.hub import ModelHub
from inferflux.models.loader import EngineFactory, EngineModelLoader
from inferflux.models.resident import ResidentModel, build_serving, system_fingerprint
from inferflux.models.serving import ClientEngine, EngineWrapper, ServedEngine
from inferflux.models.spec import model_settings
from inferflux.security.policy import PolicySource
from inferflux.security.principal import Scope
from inferflux.security.rbac import require_scope

if TYPE_CHECKING:  # NOTE: imported when used: it needs the code `make proto` generates
    from inferflux.api.grpc import GrpcServer

logger = logging.getLogger(__name__)
_GRPC_GENERATED = "inferflux.api.grpc.gen"  # `make proto` writes it (gitignored)

__all__ = ["create_app", "system_fingerprint"]

# Every router and the scope its routes need (None: public, see `security_layer`).
_ROUTERS: tuple[tuple[APIRouter, Scope | None], ...] = (
    (health.router, None),
    (stats.router, Scope.READ),
    (debug.router, Scope.ADMIN),
    (chat.router, Scope.GENERATE),
    (completions.router, Scope.GENERATE),
    (openai_models.router, Scope.READ),
    (tokenize.router, Scope.GENERATE),
    (native_generate.router, Scope.GENERATE),
    (native_chat.router, Scope.GENERATE),
    (embeddings.router, Scope.GENERATE),
    (native_embeddings.router, Scope.GENERATE),
    (ollama_generate.router, Scope.GENERATE),
    (ollama_chat.router, Scope.GENERATE),
    (ollama_embed.router, Scope.GENERATE),
    (ollama_models.router, Scope.READ),
    (ollama_manage.router, Scope.ADMIN),
    (ollama_blobs.router, Scope.ADMIN),
    (ollama_pull.router, Scope.ADMIN),
    (admin.router, Scope.ADMIN),
    (admin_models.router, Scope.ADMIN),
    (admin_adapters.router, Scope.ADAPTER_MANAGER),
    (anthropic_messages.router, Scope.GENERATE),
    (responses_routes.router, Scope.GENERATE),
    (responses_socket.router, Scope.GENERATE),
    (lmstudio_routes.router, Scope.GENERATE),
    (lmstudio_models.router, Scope.READ),
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
    catalog: Catalog | None = None,
    engines: EngineFactory = make_engine_client,
) -> FastAPI:
    """The InferFlux HTTP app. Its lifespan starts the models' engines and stops them.

    `engine`, `tokenizer` and `model_info` are the default model's (its engine not started
    yet); `catalog` lists the other models and where new ones may come from (None: the
    default model alone, admin loads resolving in its folder); `engines` builds the engine
    client of every model loaded later. `tracer_provider` replaces the one
    `observability.tracing` describes (tests). `security` is built from `settings` when
    not given (`inferflux serve` builds it first, so a bad policy store fails before the
    model loads); `policy_source` replaces its policy (tests that change the policy
    directly). Raises ModelLoadError when the chat template (the GGUF's, or
    `model.chat_template`) does not compile, PolicyStoreError when the policy store cannot
    be read.
    """
    app = FastAPI(
        title="InferFlux", version=__version__, lifespan=_lifespan, redirect_slashes=False
    )
    catalog = catalog or single_model_catalog(
        settings, Path(model_info.path), model_info.model_id, model_info.aliases
    )
    models: ModelHub | None = None
    telemetry = make_telemetry(
        settings, lambda: models.workers() if models else [], model_info, tracer_provider,
        lambda: models.channels() if models else [])  # fmt: skip
    access = security or build_security(settings)
    if telemetry.metrics is not None:
        replication = access.sync.status if access.sync is not None else None
        telemetry.metrics.watch_policy(lambda: access.policy.current().version, replication)
    layer = make_security_layer(settings, telemetry.metrics, policy_source or access.policy)
    wrap = _engine_wrapper(telemetry, layer)
    serving = build_serving(
        model_settings(settings, catalog.default), engine, tokenizer, model_info, wrap
    )
    models = ModelHub(
        settings.registry,
        catalog,
        ResidentModel(catalog.default, serving, close=getattr(tokenizer, "close", None)),
        EngineModelLoader(settings, wrap, engines),
    )
    generation = GenerationService(telemetry)
    responses = settings.responses
    stored = ResponseStore(
        max_responses=responses.max_stored,
        max_bytes=responses.max_stored_bytes,
        ttl_s=responses.ttl_s,
    )
    live = LiveConfig(settings, models)
    state = AppState(settings, telemetry, access, layer, models, generation, stored, live)
    state.config_sync = make_config_sync(settings.redis, live)
    state.model_sync = sync = make_model_sync(settings.redis, models, models.models)
    if telemetry.metrics is not None and sync is not None:
        telemetry.metrics.watch_model_replication(sync.version, sync.num_failed)
    attach_state(app, state)
    install_error_handlers(app)
    _include_routers(app, settings)
    install_openapi(app, event_models=[NativeStreamEvent])
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(TrailingSlashMiddleware)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_bytes=settings.server.max_request_bytes,
        uploads_prefix=ollama_blobs.BLOBS_PREFIX,
    )
    install_security(app, settings, access, layer)
    app.add_middleware(DrainMiddleware, drain=generation.drain)  # 503 while shutting down
    app.add_middleware(TelemetryMiddleware, telemetry=telemetry)
    app.add_middleware(RequestIdMiddleware)
    return app


def _engine_wrapper(telemetry: Telemetry, layer: SecurityLayer) -> EngineWrapper:
    """How every model's engine is seen by the routes: observed, then guarded."""

    def wrap(engine: EngineClient, tokenizer: Tokenizer, model_info: ModelInfo) -> ServedEngine:
        return GuardedEngine(
            ObservedEngine(ClientEngine(engine), telemetry, model_info.model_id),
            tokenizer=tokenizer,
            model=model_info.model_id,
            source=layer.source,
            limits=layer.limits,
            guardrails=layer.guardrails,
        )

    return wrap


def _grpc_routers() -> tuple[tuple[APIRouter, Scope | None], ...]:
    """The gRPC bridge's internal routes; none when the code `make proto` generates is
    missing (a checkout that never ran `make setup`: the HTTP API still serves, and
    `server.grpc_port` then fails with a ConfigError that says so)."""
    try:
        from inferflux.api.grpc import models_router, router
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith(_GRPC_GENERATED):
            raise
        return ()
    return ((router, Scope.GENERATE), (models_router, Scope.READ))


def _include_routers(app: FastAPI, settings: Settings) -> None:
    for router, scope in (*_ROUTERS, *_grpc_routers()):
        app.include_router(router, dependencies=[require_scope(scope)] if scope else None)
    console = console_router(settings)
    if console is not None:  # public page and sign-in; the rest needs a credential
        app.include_router(console)
    public_metrics = metrics.is_public(settings)
    app.include_router(
        metrics.router, dependencies=None if public_metrics else [require_scope(Scope.READ)]
    )


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the engines in the background so /livez answers (and /readyz says 503)
    while the default model loads, and the policy and live config replication (after
    one catch-up each; the models' once the default model serves); stop every model's
    engine and the replication on exit."""
    state = app_state(app)
    state.engine_start_error = None
    logger.info("starting the engine for %s", state.models.default_serving().model_info.model_id)
    starting = asyncio.create_task(_start_engine(state), name="engine-start")
    # policy and live config replication (redis.url set)
    syncs = [s for s in (state.security.sync, state.config_sync) if s is not None]
    for sync in syncs:
        await sync.start()
    grpc_server = await _start_grpc(app, state)
    try:
        yield
    finally:
        if grpc_server is not None:
            await grpc_server.stop()
        for sync in syncs:
            await sync.close()
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        if state.model_sync is not None:
            await state.model_sync.close()
        await state.models.shutdown()
        await state.security_layer.aclose()
        state.telemetry.shutdown()


async def _start_grpc(app: FastAPI, state: AppState) -> GrpcServer | None:
    """The gRPC frontend on `server.grpc_port` (None when unset): a bridge into `app`, so
    its calls pass every middleware. Raises ConfigError when its generated code is
    missing."""
    if state.settings.server.grpc_port is None:
        return None
    try:
        from inferflux.api.grpc import start_grpc_server
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith(_GRPC_GENERATED):
            raise
        raise ConfigError(
            "server.grpc_port is set but the gRPC code is not generated: run `make proto` "
            "(`make setup` does) in the source tree"
        ) from None

    def is_ready() -> bool:
        draining = state.generation.drain.draining or (
            state.draining is not None and state.draining()
        )
        return takes_requests(state.models.default_serving().engine) and not draining

    return await start_grpc_server(app, state.settings.server, is_ready)


async def _start_engine(state: AppState) -> None:
    """Wait for the default model's first ready worker (the other models then load in
    the background). If none can start, record why on `state.engine_start_error` and call
    `state.request_shutdown` when the runner set one (`inferflux serve` does, and then
    exits 1)."""
    try:
        await state.models.start()
    except InferfluxError as exc:
        state.engine_start_error = exc.message
        logger.error("the engine could not start: %s; shutting down", exc.message)
        if state.request_shutdown is not None:
            state.request_shutdown()
        return
    serving = state.models.default_serving()
    logger.info(
        "ready: serving %s (n_ctx %d, %s chat template)",
        serving.model_info.model_id,
        serving.model_info.n_ctx,
        "fallback" if serving.chat_template.is_fallback else "the model's",
    )
    if state.model_sync is not None:  # after the start: it may load the cluster's models
        await state.model_sync.start()
