"""GET /server/stats: a JSON snapshot of the server, its default model and its workers, and
the state of every registered model.

Read-only and cheap (no engine round trip): worker state comes from the latest stats
each worker sent with its last step; throughput from the app's `ThroughputMeter`, fed by
every engine step.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import msgspec
from fastapi import APIRouter

from inferflux import __version__
from inferflux.api.model_sync import replication_json
from inferflux.api.openai.models import model_card
from inferflux.api.pools import channel_json, pool_summary, takes_requests
from inferflux.api.security_layer import SecurityState
from inferflux.api.state import AppState, ModelsDep, StateDep, TelemetryDep
from inferflux.engine.messages import KvTierStats, SpeculativeStats
from inferflux.engine.protocol import WorkerStatus
from inferflux.engine.speculative import MATCH_BUCKETS
from inferflux.observability.worker_metrics import PRIORITIES

router = APIRouter(tags=["ops"])

_THROUGHPUT_WINDOWS = {"10s": 10, "1m": 60}


def worker_stats(status: WorkerStatus) -> dict[str, object]:
    """One worker: identity, liveness and load, then its EngineStats fields."""
    return {
        "worker_id": status.worker_id,
        "pid": status.pid,
        "ready": status.ready,
        "restarts": status.restarts,
        "num_in_flight": status.num_in_flight,
        "load_s": status.load_s,
        "hangs": status.hangs,
        "draining": status.draining,
        "backend": status.backend,
        "requested_backend": status.requested_backend,
        "fallback_reason": status.fallback_reason,
        "busy": status.stats.num_running > 0,
        **msgspec.to_builtins(status.stats),
        "role": status.role,  # the pool (the API's view: set before the first stats)
        "routing": _worker_routing(status),
    }


def _worker_routing(status: WorkerStatus) -> dict[str, object] | None:
    """Routing decisions that picked this worker ("strategy/outcome": count), prompt
    tokens sent to it because it held them, and the prefix blocks indexed for it."""
    routing = status.routing
    if routing is None:
        return None
    return {
        "decisions": {f"{s}/{o}": n for (s, o), n in sorted(routing.decisions.items())},
        "affinity_tokens": routing.affinity_tokens,
        "indexed_blocks": routing.indexed_blocks,
    }


def routing_stats(strategy: str, statuses: list[WorkerStatus]) -> dict[str, object]:
    """The routing strategy in force and its decisions summed over workers."""
    decisions: dict[str, int] = {}
    for status in statuses:
        if status.routing is not None:
            for (s, o), n in status.routing.decisions.items():
                decisions[f"{s}/{o}"] = decisions.get(f"{s}/{o}", 0) + n
    return {"strategy": strategy, "decisions": dict(sorted(decisions.items()))}


def cache_stats(statuses: list[WorkerStatus]) -> dict[str, object] | None:
    """The prefix caches of every worker, summed (None when the cache is off)."""
    caches = [s.stats.prefix_cache for s in statuses if s.stats.prefix_cache is not None]
    if not caches:
        return None
    total = {
        key: sum(getattr(c, key) for c in caches)
        for key in ("hits", "misses", "partial_hits", "matched_tokens", "evictions")
        + ("inserts", "entries", "cached_tokens", "max_tokens", "parked", "parked_tokens")
    }
    lookups = total["hits"] + total["misses"]
    return {**total, "hit_rate": round(total["hits"] / lookups, 4) if lookups else 0.0}


def kv_tier_stats(statuses: list[WorkerStatus]) -> dict[str, int] | None:
    """The prefix cache's host and disk tiers of every worker, summed (None when off)."""
    tiers = [s.stats.kv_tiers for s in statuses if s.stats.kv_tiers is not None]
    if not tiers:
        return None
    return {key: sum(getattr(t, key) for t in tiers) for key in KvTierStats.__struct_fields__}


def speculative_stats(statuses: list[WorkerStatus]) -> dict[str, object] | None:
    """Speculative decoding over every worker, summed (None when it is off): drafts
    verified and accepted whole, tokens drafted and accepted, the acceptance rate and
    tokens per verified step (the speedup of a decode step before the rows' cost)."""
    specs = [s.stats.speculative for s in statuses if s.stats.speculative is not None]
    if not specs:
        return None
    total = {
        key: sum(getattr(s, key) for s in specs)
        for key in ("chunks", "chunks_accepted", "drafted_tokens", "accepted_tokens")
    }
    drafted, chunks = total["drafted_tokens"], total["chunks"]
    return {
        **total,
        "acceptance_rate": round(total["accepted_tokens"] / drafted, 4) if drafted else 0.0,
        "tokens_per_verification": (
            round(1 + total["accepted_tokens"] / chunks, 4) if chunks else 0.0
        ),
        "by_match_length": _by_match_length(specs),
    }


def _by_match_length(specs: list[SpeculativeStats]) -> list[dict[str, object]]:
    """What the goodput gate learned, per bucket of match lengths: the acceptance of a
    draft position (the workers' rates weighted by the positions each saw; the starting
    prior where none saw any) and the positions verified."""
    out: list[dict[str, object]] = []
    for b, shortest in enumerate(MATCH_BUCKETS):
        learned = [(s.match_rates[b], s.match_seen[b]) for s in specs if len(s.match_seen) > b]
        if not learned:
            continue
        seen = sum(n for _, n in learned)
        if seen:
            rate = sum(r * n for r, n in learned) / seen
        else:
            rate = statistics.fmean(r for r, _ in learned)
        out.append({"from": shortest, "acceptance": round(rate, 4), "positions": seen})
    return out


def policy_stats(security: SecurityState) -> dict[str, object]:
    """The policy version this replica runs, and its replication's state (None without
    `redis.url`): Redis reachable, when the version was applied, the last lag."""
    sync = security.sync
    return {
        "version": security.policy.current().version,
        "replication": dataclasses.asdict(sync.status()) if sync is not None else None,
    }


def model_replication(state: AppState) -> dict[str, object] | None:
    """The admin-loaded models' replication state and the models that failed to load
    here (None without `redis.url`)."""
    sync = state.model_sync
    return replication_json(sync.status()) if sync is not None else None


def config_replication(state: AppState) -> dict[str, object] | None:
    """The live config's replication state (None without `redis.url`)."""
    sync = state.config_sync
    return dataclasses.asdict(sync.status()) if sync is not None else None


@router.get("/server/stats")
async def server_stats(
    telemetry: TelemetryDep, models: ModelsDep, state: StateDep
) -> dict[str, object]:
    """Uptime, the default model, queue depth per priority, active batches, per-worker
    status and load, cache statistics and token throughput (of the default model's
    workers), routing (strategy and decisions), token throughput over the last 10 s and
    minute, every model's state, the policy version (with its replication across
    replicas) and the live config's replication. In disaggregated mode `pools` has each
    pool's workers, ready ones, queue depth and requests, and `channel` the KV channel's
    counters (both None in unified mode)."""
    serving = models.default_serving()
    statuses = serving.engine.workers()
    channel = serving.engine.channel()
    throughput = {}
    for name, window_s in _THROUGHPUT_WINDOWS.items():
        prompt, generated = telemetry.meter.rates(window_s)
        throughput[name] = {
            "prompt_tokens_per_s": round(prompt, 3),
            "generation_tokens_per_s": round(generated, 3),
        }
    return {
        "version": __version__,
        "uptime_s": round(time.monotonic() - serving.started_at, 3),
        "ready": takes_requests(serving.engine),
        "model": model_card(serving.model_info),
        "num_workers": len(statuses),
        "num_in_flight": sum(status.num_in_flight for status in statuses),
        "queue_depth": sum(s.stats.num_waiting for s in statuses),
        "queue_depth_by_priority": {
            p: sum(s.stats.waiting_by_priority.get(p, 0) for s in statuses) for p in PRIORITIES
        },
        "num_running": sum(s.stats.num_running for s in statuses),
        "active_batches": sum(1 for s in statuses if s.stats.num_running > 0),
        "kv_cells_used": sum(s.stats.kv_cells_used for s in statuses),
        "kv_cells_total": sum(s.stats.kv_cells_total for s in statuses),
        "prefix_cache": cache_stats(statuses),
        "kv_tiers": kv_tier_stats(statuses),
        "speculative": speculative_stats(statuses),
        "routing": routing_stats(state.settings.scheduler.routing, statuses),
        "mode": "unified" if channel is None else "disaggregated",
        "pools": None if channel is None else pool_summary(statuses, channel),
        "channel": channel_json(channel),
        "throughput": throughput,
        "workers": [worker_stats(status) for status in statuses],
        "models": [
            {
                "id": v.model_id,
                "state": v.state,
                "default": v.is_default,
                "num_in_flight": v.num_in_flight,
                "num_workers": len(v.workers),
                "speculative": speculative_stats(list(v.workers)),
            }
            for v in models.models()
        ],  # fmt: skip
        "policy": policy_stats(state.security),
        "config_replication": config_replication(state),
        "model_replication": model_replication(state),
    }
