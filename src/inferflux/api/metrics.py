"""GET /metrics: Prometheus exposition of the engine's scheduler and prefix-cache state.

Owns: one `CollectorRegistry` per app and `EngineCollector`, which turns the latest
`EngineStats` of every worker (sent with each step; no engine round trip) into metric
families with the OBS-1 names. Worker counters are summed over workers; a restarted
worker starts its counters again at 0, which Prometheus' `rate()` treats as a reset.
Labels stay bounded: `priority` only (never a key, user or prompt).

The observability issue extends this module with request latency histograms and more.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from inferflux.engine.messages import EngineStats
from inferflux.engine.protocol import EngineClient

router = APIRouter(tags=["ops"])

_PRIORITIES = ("high", "normal", "low")


class EngineCollector(Collector):
    """Scheduler, fairness and prefix-cache metrics from the workers' latest stats."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = [w.stats for w in self._engine.workers()]
        yield _gauge(
            "inferflux_scheduler_queue_depth",
            "Requests queued in the engine workers, not running yet",
            sum(s.num_waiting for s in stats),
        )
        waiting = GaugeMetricFamily(
            "inferflux_scheduler_queue_depth_by_priority",
            "Queued requests per priority",
            labels=["priority"],
        )
        for p in _PRIORITIES:
            waiting.add_metric([p], sum(s.waiting_by_priority.get(p, 0) for s in stats))
        yield waiting
        yield _gauge(
            "inferflux_running_sequences",
            "Sequences decoding now",
            sum(s.num_running for s in stats),
        )
        yield _gauge(
            "inferflux_kv_cells_used", "KV cells in use", sum(s.kv_cells_used for s in stats)
        )
        yield _gauge(
            "inferflux_kv_cells_total", "KV cells allocated", sum(s.kv_cells_total for s in stats)
        )
        yield from _fairness(stats)
        yield from _prefix(stats)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _fairness(stats: list[EngineStats]) -> Iterator[Metric]:
    f = [s.fairness for s in stats]
    yield _counter(
        "inferflux_fairness_preemptions",
        "Requests preempted by the fairness controller",
        sum(x.preemptions for x in f),
    )
    yield _counter(
        "inferflux_fairness_yields",
        "Requests yielded after timeslice expiry",
        sum(x.yields for x in f),
    )
    yield _counter(
        "inferflux_fairness_resumes",
        "Resumed requests after a fairness yield or preemption",
        sum(x.resumes for x in f),
    )
    yield _counter(
        "inferflux_queue_timeouts",
        "Requests that waited past scheduler.queue_timeout_s (408)",
        sum(x.timeouts for x in f),
    )
    tokens = CounterMetricFamily(
        "inferflux_fairness_tokens", "Tokens generated per priority level", labels=["priority"]
    )
    for p in _PRIORITIES:
        tokens.add_metric([p], sum(x.tokens.get(p, 0) for x in f))
    yield tokens


def _prefix(stats: list[EngineStats]) -> Iterator[Metric]:
    caches = [s.prefix_cache for s in stats if s.prefix_cache is not None]
    hits = sum(c.hits for c in caches)
    misses = sum(c.misses for c in caches)
    yield _counter("inferflux_prefix_hits", "Prefix cache lookups that reused KV", hits)
    yield _counter("inferflux_prefix_misses", "Prefix cache lookups that found nothing", misses)
    yield _counter(
        "inferflux_prefix_partial_hits",
        "Hits that matched less than the whole cached entry",
        sum(c.partial_hits for c in caches),
    )
    yield _counter(
        "inferflux_prefix_matched_tokens",
        "Prompt tokens whose KV came from the prefix cache",
        sum(c.matched_tokens for c in caches),
    )
    yield _counter(
        "inferflux_prefix_evictions",
        "Prefix cache entries evicted (LRU)",
        sum(c.evictions for c in caches),
    )
    yield _gauge(
        "inferflux_prefix_hit_rate",
        "Hits / lookups since start (0 before the first lookup)",
        hits / (hits + misses) if hits + misses else 0.0,
    )
    yield _gauge(
        "inferflux_prefix_cached_tokens",
        "Tokens held by the prefix cache now",
        sum(c.cached_tokens for c in caches),
    )


def make_registry(engine: EngineClient) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (version 0.0.4)."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
