"""GET /server/stats: a JSON snapshot of the server, its model and every engine worker.

Read-only and cheap (no engine round trip): worker state comes from the latest stats
each worker sent with its last step.
"""

from __future__ import annotations

import time

import msgspec
from fastapi import APIRouter

from inferflux import __version__
from inferflux.api.deps import ServingDep
from inferflux.api.openai.models import model_card
from inferflux.engine.protocol import WorkerStatus

router = APIRouter(tags=["ops"])


def worker_stats(status: WorkerStatus) -> dict[str, object]:
    """One worker: identity and liveness, then its EngineStats fields."""
    return {
        "worker_id": status.worker_id,
        "pid": status.pid,
        "ready": status.ready,
        "restarts": status.restarts,
        "num_in_flight": status.num_in_flight,
        **msgspec.to_builtins(status.stats),
    }


@router.get("/server/stats")
async def server_stats(serving: ServingDep) -> dict[str, object]:
    """Uptime, the served model, and per-worker queue and throughput counters."""
    statuses = serving.engine.workers()
    return {
        "version": __version__,
        "uptime_s": round(time.monotonic() - serving.started_at, 3),
        "ready": serving.engine.ready,
        "model": model_card(serving.model_info),
        "num_workers": len(statuses),
        "num_in_flight": sum(status.num_in_flight for status in statuses),
        "queue_depth": sum(s.stats.num_waiting for s in statuses),
        "queue_depth_by_priority": {
            p: sum(s.stats.waiting_by_priority.get(p, 0) for s in statuses)
            for p in ("high", "normal", "low")
        },
        "workers": [worker_stats(status) for status in statuses],
    }
