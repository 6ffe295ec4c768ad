"""Kubernetes probes: /healthz and /livez (the process answers), /readyz (the engine does).

These are the only public routes (no auth, ever); they touch nothing but the default
model's `engine.ready` (in disaggregated mode its workers' snapshots and KV channel) and
whether the server is shutting down (`api/drain.py`).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import JSONResponse, Response

from inferflux.api.drain import REFUSED
from inferflux.api.errors import error_response
from inferflux.api.openapi import error_doc
from inferflux.api.pools import pool_summary, takes_requests
from inferflux.api.state import StateDep
from inferflux.errors import NoWorkerReady, ShuttingDown
from inferflux.models.serving import ServedEngine

router = APIRouter(tags=["health"])

_OK = b'{"status":"ok"}'


@router.get("/healthz")
@router.get("/livez")
async def live() -> Response:
    """200 while the API process serves HTTP, whatever the engine's state."""
    return Response(_OK, media_type="application/json")


@router.get(
    "/readyz",
    responses={503: error_doc("No engine worker (decode worker) is ready yet, or shutting down")},
)
async def ready(state: StateDep) -> Response:
    """200 while at least one engine worker takes requests and the server is not
    shutting down; else 503 (OpenAI envelope). In disaggregated mode: 200 while a decode
    worker is ready, the body saying each pool's ready and size workers and `"status":
    "degraded"` when the prefill pool has none ready (requests then run on the decode
    workers alone); 503 without a ready decode worker."""
    if state.generation.drain.draining:
        return error_response(ShuttingDown(REFUSED))
    engine = state.models.default_serving().engine
    if engine.channel() is not None:
        return _pools_ready(engine)
    if not takes_requests(engine):
        return error_response(NoWorkerReady("no engine worker is ready yet"))
    return Response(_OK, media_type="application/json")


def _pools_ready(engine: ServedEngine) -> Response:
    if not takes_requests(engine):
        return error_response(NoWorkerReady("no decode worker is ready yet"))
    pools = pool_summary(engine.workers(), engine.channel())
    status = "ok" if all(pool["ready"] for pool in pools.values()) else "degraded"
    sizes = {role: {"ready": p["ready"], "size": p["size"]} for role, p in pools.items()}
    return JSONResponse({"status": status, "pools": sizes})
