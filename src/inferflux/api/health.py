"""Kubernetes probes: /healthz and /livez (the process answers), /readyz (the engine does).

These are the only public routes (no auth, ever); they touch nothing but the default
model's `engine.ready` and whether the server is shutting down (`api/drain.py`).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from inferflux.api.drain import REFUSED
from inferflux.api.errors import error_response
from inferflux.api.openapi import error_doc
from inferflux.api.state import StateDep
from inferflux.errors import NoWorkerReady, ShuttingDown

router = APIRouter(tags=["health"])

_OK = b'{"status":"ok"}'


@router.get("/healthz")
@router.get("/livez")
async def live() -> Response:
    """200 while the API process serves HTTP, whatever the engine's state."""
    return Response(_OK, media_type="application/json")


@router.get(
    "/readyz", responses={503: error_doc("No engine worker is ready yet, or shutting down")}
)
async def ready(state: StateDep) -> Response:
    """200 while at least one engine worker takes requests and the server is not
    shutting down; else 503 (OpenAI envelope)."""
    if state.generation.drain.draining:
        return error_response(ShuttingDown(REFUSED))
    if not state.models.default_serving().engine.ready:
        return error_response(NoWorkerReady("no engine worker is ready yet"))
    return Response(_OK, media_type="application/json")
