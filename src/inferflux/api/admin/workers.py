"""/v1/admin/workers: each loaded model's engine workers, and runtime scaling (REQ-7.5).

GET lists the workers of every loaded model (`?model=` picks one). POST
`{"model": "<id or alias; default: the default model>", "workers": N}` runs N workers of
that model from now on: new ones are waited for, removed ones (fewest in flight first)
leave rotation at once and finish their requests before they stop
(`runtime.worker_drain_timeout_s`), so no request is dropped. The count lasts until the
model is loaded again or the server restarts (`runtime.workers` is the start value).
In disaggregated mode (`scheduler.mode`) `"role": "prefill" | "decode"` picks the pool
(without it: the decode pool), and the listing adds each pool's size and ready workers.
Each change is logged and audited with its actor.

Errors: 400 a malformed body, a count outside 1..64, or a role in unified mode; 404 an
unknown model, 409 a model that is registered but not loaded.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from inferflux.api.admin.changes import record_change
from inferflux.api.deps import json_body
from inferflux.api.openapi import error_doc
from inferflux.api.pools import pool_summary
from inferflux.api.state import ModelsDep
from inferflux.api.stats import worker_stats
from inferflux.engine.protocol import MAX_WORKERS, ChannelStats, WorkerStatus
from inferflux.errors import Conflict, InvalidRequest
from inferflux.models.protocol import ModelDirectory
from inferflux.models.serving import ServingState

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class ScaleWorkersBody(BaseModel):
    """How many workers a model runs from now on."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(None, min_length=1, max_length=256)
    workers: int = Field(ge=1, le=MAX_WORKERS)
    role: Literal["prefill", "decode"] | None = Field(
        None, description="Disaggregated mode: the pool to scale (default: decode)."
    )


ScaleWorkersUpdate = Annotated[ScaleWorkersBody, Depends(json_body(ScaleWorkersBody))]


def workers_view(serving: ServingState, is_default: bool) -> dict[str, object]:
    """One model's workers: the count in rotation or starting, the ones draining, each."""
    statuses: list[WorkerStatus] = serving.engine.workers()
    channel = serving.engine.channel()
    return {
        "model": serving.model_info.model_id,
        "default": is_default,
        "num_workers": sum(1 for s in statuses if not s.draining),
        "num_draining": sum(1 for s in statuses if s.draining),
        "mode": "unified" if channel is None else "disaggregated",
        "pools": None if channel is None else _pool_sizes(statuses, channel),
        "workers": [worker_stats(s) for s in statuses],
    }


def _pool_sizes(statuses: list[WorkerStatus], channel: ChannelStats) -> dict[str, object]:
    pools = pool_summary(statuses, channel)
    return {role: {"size": p["size"], "ready": p["ready"]} for role, p in pools.items()}


def _serving(models: ModelDirectory, name: str | None) -> tuple[ServingState, bool]:
    """The loaded model `name` names (None: the default). Raises ModelNotFound, or
    Conflict when it is registered but not loaded."""
    default = models.default_serving()
    if name is None:
        return default, True
    serving = models.resident(name)
    if serving is None:
        raise Conflict(
            f"model '{name}' is not loaded; load it first (POST /v1/admin/models)",
            param="model",
        )
    return serving, serving.model_info.model_id == default.model_info.model_id


@router.get("/workers")
async def list_workers(models: ModelsDep, model: str | None = None) -> dict[str, object]:
    """The workers of every loaded model, or of `model`."""
    if model is not None:
        return {"object": "list", "data": [workers_view(*_serving(models, model))]}
    default_id = models.default_serving().model_info.model_id
    data = []
    for view in models.models():
        serving = models.resident(view.model_id) if view.state == "loaded" else None
        if serving is not None:
            data.append(workers_view(serving, view.model_id == default_id))
    return {"object": "list", "data": data}


@router.post(
    "/workers",
    responses={409: error_doc("The model is registered but not loaded")},
)
async def scale_workers(
    request: Request, body: ScaleWorkersUpdate, models: ModelsDep
) -> dict[str, object]:
    """Run `workers` workers of `model` (of its `role` pool) from now on; answers once
    the new count is in rotation (added workers ready, removed ones draining)."""
    serving, is_default = _serving(models, body.model)
    role = body.role
    if role is not None and serving.engine.channel() is None:
        raise InvalidRequest(
            f"role '{role}': the model runs in unified mode (scheduler.mode), one pool",
            param="role",
        )
    pool = role or ("decode" if serving.engine.channel() is not None else "unified")
    before = sum(1 for s in serving.engine.workers() if not s.draining and s.role == pool)
    # NOTE: shielded: an admin client that gives up does not leave a half-made change.
    await asyncio.shield(serving.engine.scale(body.workers, role))
    model_id = serving.model_info.model_id
    change: dict[str, object] = {"from": before, "to": body.workers}
    if role is not None:
        change["role"] = role
    record_change(request, f"workers.scale:{model_id}", change)
    return workers_view(serving, is_default)
