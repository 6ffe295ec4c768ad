"""`serving_for`: the dependency that leases the model a request's body names.

Routes resolve the request's `model` (an id or alias, Ollama's `name:latest` too) to the
`ServingState` of a resident model through the models' `ModelDirectory` (models/hub.py),
and hold it until their response is sent: a model being swapped out finishes those
requests before it is retired. That lease is the one way the API reaches a model for a
request; the ops routes read the default model without one (`ModelDirectory.default`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Depends, Request
from pydantic import BaseModel

from inferflux.api.deps import json_body
from inferflux.api.errors import is_ollama_path
from inferflux.api.state import app_state
from inferflux.errors import ModelNotFound
from inferflux.models.serving import ServingState
from inferflux.security.context import context_of
from inferflux.security.rbac import authorize_model


def _count_moe(request: Request, serving: ServingState) -> None:
    info = serving.model_info
    metrics = app_state(request.app).telemetry.metrics
    if info.is_moe and metrics is not None:
        metrics.moe_requests.labels(info.model_id).inc()


def _str_field(body: Any, name: str) -> str | None:  # Any: a request model
    value = getattr(body, name, None)
    return value if isinstance(value, str) else None


def serving_for(body_model: type[BaseModel]) -> Callable[..., AsyncIterator[ServingState]]:
    """The lease of the model a JSON `body_model` request names (`lease_for`); the body is
    parsed once: the route's own `json_body(body_model)` dependency is the same one."""
    return lease_for(json_body(body_model))


def lease_for(
    body_dependency: Callable[..., Awaitable[Any]],  # Any: a body with `model` (`adapter`)
    *,
    listing: str = "GET /v1/models lists the models and their adapters",
) -> Callable[..., AsyncIterator[ServingState]]:
    """The dependency that leases the model the body `body_dependency` reads names (its
    `model`, and its `adapter` when it has one) until the response is fully sent, once
    the caller's `allowed_models` (403) permit it.

    An unknown model is a 404 `model_not_found`: Ollama's message under /api/, elsewhere
    one that says where the models are listed (`listing`)."""

    async def lease_model(
        request: Request,
        body: Any = Depends(body_dependency),  # noqa: B008  # FastAPI's idiom
    ) -> AsyncIterator[ServingState]:
        name, adapter = _str_field(body, "model"), _str_field(body, "adapter")
        models = app_state(request.app).models
        principal = context_of(request.scope).caller
        ollama = is_ollama_path(request.url.path)
        try:
            names = models.access_names(name, adapter)
            # NOTE: before the lease, which may load the model: a caller outside the
            # model's `allowed_models` never makes the server load it
            latest = (f"{n}:latest" for n in names if ollama and ":" not in n)
            authorize_model(principal, *names, *latest)
            async with models.lease(name, adapter) as serving:
                _count_moe(request, serving)
                yield serving
        except ModelNotFound as exc:
            if ollama:
                raise
            shown = name if adapter is None else f"{name or ''}:{adapter}"
            raise ModelNotFound(
                f"the model '{shown}' does not exist on this server ({listing})",
                param=exc.param,
            ) from None

    return lease_model
