"""GET /debug/requests and GET /debug/requests/{request_id}: live and recent generations.

ADMIN-ONLY: these routes show token ids (and, with `observability.debug_prompts`, text)
of every client's requests, so `api/app.py` includes them with the `admin` scope. Admins
are operators of the whole server and see every tenant's requests (each shows its
`tenant`; `?tenant=` filters); no other principal reaches these routes at all, which is
how one tenant never sees another's requests. With authentication off everyone is admin.

Memory is bounded by `observability.debug_history` and `observability.debug_trace_events`
(api/request_tracker.py).
"""

from __future__ import annotations

import time

from fastapi import APIRouter

from inferflux.api.state import TelemetryDep
from inferflux.errors import NotFound

ADMIN_PREFIX = "/debug"

router = APIRouter(prefix=ADMIN_PREFIX, tags=["debug (admin)"])


@router.get("/requests")
async def debug_requests(telemetry: TelemetryDep, tenant: str | None = None) -> dict[str, object]:
    """Running and queued generations (oldest first) with their tenant, phase, tokens so
    far and timings, and the most recently finished ones (newest first); `?tenant=` keeps
    one tenant's. Admin-only."""
    now = time.monotonic()
    tracker = telemetry.tracker
    return {
        "active": [t.summary(now) for t in tracker.live() if tenant in (None, t.tenant)],
        "recent": [t.summary(now) for t in tracker.recent() if tenant in (None, t.tenant)],
    }


@router.get("/requests/{request_id}")
async def debug_request(request_id: str, telemetry: TelemetryDep) -> dict[str, object]:
    """One generation with its token trace: each delta's time after submission, token ids,
    and text when `observability.debug_prompts` is on. Admin-only."""
    tracked = telemetry.tracker.get(request_id)
    if tracked is None:
        raise NotFound(
            f"no request '{request_id}' is running or among the last finished ones "
            "(observability.debug_history); list them with GET /debug/requests",
            param="request_id",
        )
    return tracked.detail(time.monotonic())
