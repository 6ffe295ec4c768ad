"""`AppState`: everything one app holds, typed, on `app.state.inferflux` (one attribute,
not a bag of strings), and the dependencies that hand its parts to handlers.

Owns: `AppState`, `app_state(app)`, and the `Annotated` aliases routes depend on
(`StateDep`, `TelemetryDep`, `ModelsDep`, `LifecycleDep`, `SecurityDep`, `GenerationDep`,
`ContextDep`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, cast

from fastapi import Depends, FastAPI, Request
from starlette.types import ASGIApp

from inferflux.api.config_sync import ConfigSync
from inferflux.api.generation.service import GenerationService
from inferflux.api.live_config import LiveConfig
from inferflux.api.model_sync import ModelSync
from inferflux.api.response_store import ResponseStore
from inferflux.api.security_layer import SecurityLayer, SecurityState
from inferflux.api.telemetry import Telemetry
from inferflux.config.settings import Settings
from inferflux.models.hub import ModelHub
from inferflux.models.protocol import ModelDirectory, ModelLifecycle
from inferflux.security.context import RequestContext, context_of

_ATTRIBUTE = "inferflux"


@dataclass(slots=True)
class AppState:
    """One app's parts. `engine_start_error` is set when no worker of the default model
    could start; `request_shutdown`, when set (by `inferflux serve`), stops the server;
    `draining`, when set (by `inferflux serve`), says whether the server is stopping (the
    gRPC health service then says NOT_SERVING)."""

    settings: Settings
    telemetry: Telemetry
    security: SecurityState
    security_layer: SecurityLayer
    models: ModelHub
    generation: GenerationService
    responses: ResponseStore  # the Responses API's stored responses
    live_config: LiveConfig  # GET/PATCH /v1/admin/config
    config_sync: ConfigSync | None = None  # live config replication (redis.url set)
    model_sync: ModelSync | None = None  # admin-loaded models' replication (redis.url set)
    engine_start_error: str | None = None
    request_shutdown: Callable[[], None] | None = None
    draining: Callable[[], bool] | None = None


def app_state(app: FastAPI | ASGIApp) -> AppState:
    """The state `create_app` put on `app` (a FastAPI app, or Starlette's `request.app`)."""
    return cast(AppState, getattr(app.state, _ATTRIBUTE))  # type: ignore[union-attr]


def attach_state(app: FastAPI, state: AppState) -> None:
    setattr(app.state, _ATTRIBUTE, state)


def get_state(request: Request) -> AppState:
    return app_state(request.app)


def get_telemetry(request: Request) -> Telemetry:
    return get_state(request).telemetry


def get_models(request: Request) -> ModelDirectory:
    return get_state(request).models


def get_lifecycle(request: Request) -> ModelLifecycle:
    return get_state(request).models


def get_security(request: Request) -> SecurityState:
    return get_state(request).security


def get_generation(request: Request) -> GenerationService:
    return get_state(request).generation


def get_context(request: Request) -> RequestContext:
    return context_of(request.scope)


StateDep = Annotated[AppState, Depends(get_state)]
TelemetryDep = Annotated[Telemetry, Depends(get_telemetry)]
ModelsDep = Annotated[ModelDirectory, Depends(get_models)]
LifecycleDep = Annotated[ModelLifecycle, Depends(get_lifecycle)]
SecurityDep = Annotated[SecurityState, Depends(get_security)]
GenerationDep = Annotated[GenerationService, Depends(get_generation)]
ContextDep = Annotated[RequestContext, Depends(get_context)]
