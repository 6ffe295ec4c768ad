"""The worker pools of a model in disaggregated mode (`scheduler.mode`), as /readyz,
/server/stats and /v1/admin/workers show them.

Owns `POOL_ROLES`, `pool_summary` (per pool: size, ready, queue depth, in flight),
`channel_json` and `takes_requests` (the readiness rule of /readyz and gRPC health).
Reads only `WorkerStatus` snapshots and `ChannelStats` (no engine round trip). Does not
own the pools themselves (engine/client.py) nor their metrics
(observability/disagg_metrics.py).
"""

from __future__ import annotations

import dataclasses

from inferflux.engine.protocol import ChannelStats, WorkerStatus
from inferflux.models.serving import EngineControl

POOL_ROLES = ("prefill", "decode")


def pool_summary(
    statuses: list[WorkerStatus], channel: ChannelStats | None
) -> dict[str, dict[str, int]]:
    """Per pool: `size` (workers in rotation or starting; draining ones left out),
    `ready`, `queue_depth` (prefill: requests sent to the pool and not handed off yet, as
    the channel counts them; decode: queued in its workers), `num_running` and
    `num_in_flight`."""
    pools: dict[str, dict[str, int]] = {}
    for role in POOL_ROLES:
        members = [s for s in statuses if s.role == role and not s.draining]
        waiting = sum(s.stats.num_waiting for s in members)
        if role == "prefill" and channel is not None:
            waiting = channel.prefill_queue
        pools[role] = {
            "size": len(members),
            "ready": sum(1 for s in members if s.ready),
            "queue_depth": waiting,
            "num_running": sum(s.stats.num_running for s in members),
            "num_in_flight": sum(s.num_in_flight for s in members),
        }
    return pools


def channel_json(channel: ChannelStats | None) -> dict[str, int] | None:
    """The KV channel's counters as JSON (None in unified mode)."""
    return dataclasses.asdict(channel) if channel is not None else None


def takes_requests(engine: EngineControl) -> bool:
    """Whether the engine can serve a request now: a ready worker in unified mode, a ready
    decode worker in disaggregated mode (without a ready prefill worker the decode
    workers compute prompts themselves: degraded, not down)."""
    if engine.channel() is None:
        return engine.ready
    return any(s.ready and not s.draining and s.role == "decode" for s in engine.workers())
