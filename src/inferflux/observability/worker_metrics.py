"""The engine-state half of the metrics: `WorkerCollector`, which turns the latest
per-worker engine state into gauges and counters at scrape time, and the views of that
state it reads (the API process's `WorkerStatus` satisfies them).

Owns the scheduler, fairness, prefix-cache, KV-tier, speculative, liveness and routing
metric families. Does not own the metrics that are observed as they happen
(observability/metrics.py, which registers this collector on each app's registry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferflux.observability.disagg_metrics import TicketsView

PRIORITIES = ("high", "normal", "low")


class FairnessView(Protocol):
    """What the collector reads of a worker's fairness counters (engine `FairnessStats`)."""

    @property
    def preemptions(self) -> int: ...
    @property
    def yields(self) -> int: ...
    @property
    def resumes(self) -> int: ...
    @property
    def timeouts(self) -> int: ...
    @property
    def interrupts(self) -> int: ...
    @property
    def tokens(self) -> Mapping[str, int]: ...


class PrefixCacheView(Protocol):
    """What the collector reads of a worker's prefix cache (engine `PrefixCacheStats`)."""

    @property
    def hits(self) -> int: ...
    @property
    def misses(self) -> int: ...
    @property
    def partial_hits(self) -> int: ...
    @property
    def matched_tokens(self) -> int: ...
    @property
    def evictions(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def parked_tokens(self) -> int: ...


class KvTiersView(Protocol):
    """What the collector reads of a worker's host/disk cache tiers (engine `KvTierStats`)."""

    @property
    def host_bytes(self) -> int: ...
    @property
    def host_entries(self) -> int: ...
    @property
    def disk_bytes(self) -> int: ...
    @property
    def disk_entries(self) -> int: ...
    @property
    def host_hits(self) -> int: ...
    @property
    def disk_hits(self) -> int: ...
    @property
    def restores(self) -> int: ...
    @property
    def refusals(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def host_evictions(self) -> int: ...
    @property
    def disk_evictions(self) -> int: ...
    @property
    def dropped_writes(self) -> int: ...
    @property
    def write_errors(self) -> int: ...


class SpeculativeView(Protocol):
    """What the collector reads of a worker's speculative decoding (engine
    `SpeculativeStats`)."""

    @property
    def chunks(self) -> int: ...
    @property
    def chunks_accepted(self) -> int: ...
    @property
    def drafted_tokens(self) -> int: ...
    @property
    def accepted_tokens(self) -> int: ...


class ImagesView(Protocol):
    """What the collector reads of a worker's images (engine `ImageStats`)."""

    @property
    def num_images_total(self) -> int: ...
    @property
    def encode_seconds_total(self) -> float: ...
    @property
    def num_preparing(self) -> int: ...
    @property
    def rows_bytes(self) -> int: ...


class EngineStatsView(Protocol):
    """What the collector reads of a worker's latest state (engine `EngineStats`)."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def kv_cells_used(self) -> int: ...
    @property
    def kv_cells_total(self) -> int: ...
    @property
    def decode_failures(self) -> int: ...
    @property
    def memory_pressure(self) -> bool: ...
    @property
    def memory_pressure_episodes(self) -> int: ...
    @property
    def host_memory_available_bytes(self) -> int: ...
    @property
    def waiting_by_priority(self) -> Mapping[str, int]: ...
    @property
    def fairness(self) -> FairnessView: ...
    @property
    def prefix_cache(self) -> PrefixCacheView | None: ...
    @property
    def kv_tiers(self) -> KvTiersView | None: ...
    @property
    def speculative(self) -> SpeculativeView | None: ...
    @property
    def images(self) -> ImagesView | None: ...
    @property
    def tickets(self) -> TicketsView | None: ...


class RoutingView(Protocol):
    """What the collector reads of a worker's routing counters (engine `WorkerRouting`)."""

    @property
    def decisions(self) -> Mapping[tuple[str, str], int]: ...


class WorkerView(Protocol):
    """One worker as the API process sees it (engine `WorkerStatus`)."""

    @property
    def worker_id(self) -> int: ...
    @property
    def ready(self) -> bool: ...
    @property
    def restarts(self) -> int: ...
    @property
    def load_s(self) -> float | None: ...
    @property
    def hangs(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def requested_backend(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def stats(self) -> EngineStatsView: ...
    @property
    def routing(self) -> RoutingView | None: ...


class WorkerCollector(Collector):
    """Scheduler, KV, fairness, prefix-cache and worker-liveness metrics, read from the
    workers' latest state at scrape time (no engine round trip)."""

    def __init__(self, workers: Callable[[], Sequence[WorkerView]]) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        workers = self._workers()
        stats = [w.stats for w in workers]
        yield from _scheduler(stats)
        yield from _fairness([s.fairness for s in stats])
        yield from _prefix([s.prefix_cache for s in stats if s.prefix_cache is not None])
        yield from _kv_tiers([s.kv_tiers for s in stats if s.kv_tiers is not None])
        yield from _speculative([s.speculative for s in stats if s.speculative is not None])
        yield from _images([s.images for s in stats if s.images is not None])
        yield from _liveness(workers)
        yield _routing(workers)


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """One unlabelled gauge family."""
    return GaugeMetricFamily(name, doc, value=value)


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """One unlabelled counter family."""
    return CounterMetricFamily(name, doc, value=value)


def _scheduler(stats: list[EngineStatsView]) -> Iterator[Metric]:
    waiting = sum(s.num_waiting for s in stats)
    yield gauge(
        "inferflux_scheduler_queue_depth",
        "Requests queued in the engine workers, not running yet",
        waiting,
    )
    by_priority = GaugeMetricFamily(
        "inferflux_scheduler_queue_depth_by_priority",
        "Queued requests per priority",
        labels=["priority"],
    )
    for p in PRIORITIES:
        by_priority.add_metric([p], sum(s.waiting_by_priority.get(p, 0) for s in stats))
    yield by_priority
    yield gauge("inferflux_waiting_sequences", "Sequences waiting for a batch slot", waiting)
    yield gauge(
        "inferflux_running_sequences", "Sequences decoding now", sum(s.num_running for s in stats)
    )
    used = sum(s.kv_cells_used for s in stats)
    total = sum(s.kv_cells_total for s in stats)
    yield gauge("inferflux_kv_cells_used", "KV cells in use by running sequences", used)
    yield gauge("inferflux_kv_cells_total", "KV cells allocated", total)
    yield gauge(
        "inferflux_kv_usage_ratio", "kv_cells_used / kv_cells_total (0 before load)",
        used / total if total else 0.0,
    )  # fmt: skip
    yield counter(
        "inferflux_decode_failures",
        "llama_decode calls that failed (no KV room or an error); the step was retried "
        "after evicting the prefix cache and splitting the batch",
        sum(s.decode_failures for s in stats),
    )
    yield gauge(
        "inferflux_memory_pressure",
        "1 while a worker's host memory is below scheduler.memory_low_mb (admissions and "
        "step budget halved)",
        float(any(s.memory_pressure for s in stats)),
    )
    yield counter(
        "inferflux_memory_pressure_episodes",
        "Times a worker entered memory pressure (its prefix cache was evicted)",
        sum(s.memory_pressure_episodes for s in stats),
    )
    known = [s.host_memory_available_bytes for s in stats if s.host_memory_available_bytes >= 0]
    if known:
        yield gauge(
            "inferflux_host_memory_available_bytes",
            "Memory the host (or the container's cgroup limit) has left, as the workers read it",
            float(min(known)),
        )


def _fairness(f: list[FairnessView]) -> Iterator[Metric]:
    yield counter(
        "inferflux_fairness_preemptions",
        "Requests preempted by the fairness controller",
        sum(x.preemptions for x in f),
    )
    yield counter(
        "inferflux_fairness_yields",
        "Requests yielded after timeslice expiry",
        sum(x.yields for x in f),
    )
    yield counter(
        "inferflux_fairness_resumes",
        "Resumed requests after a fairness yield or preemption",
        sum(x.resumes for x in f),
    )
    yield counter(
        "inferflux_fairness_interrupts",
        "Engine steps stopped part-way for a high-priority arrival, then planned again",
        sum(x.interrupts for x in f),
    )
    yield counter(
        "inferflux_queue_timeouts",
        "Requests that waited past scheduler.queue_timeout_s (408)",
        sum(x.timeouts for x in f),
    )
    tokens = CounterMetricFamily(
        "inferflux_fairness_tokens", "Tokens generated per priority level", labels=["priority"]
    )
    for p in PRIORITIES:
        tokens.add_metric([p], sum(x.tokens.get(p, 0) for x in f))
    yield tokens


def _prefix(caches: list[PrefixCacheView]) -> Iterator[Metric]:
    hits = sum(c.hits for c in caches)
    misses = sum(c.misses for c in caches)
    yield counter("inferflux_prefix_hits", "Prefix cache lookups that reused KV", hits)
    yield counter("inferflux_prefix_misses", "Prefix cache lookups that found nothing", misses)
    yield counter(
        "inferflux_prefix_partial_hits",
        "Hits that matched less than the whole cached entry",
        sum(c.partial_hits for c in caches),
    )
    yield counter(
        "inferflux_prefix_matched_tokens",
        "Prompt tokens whose KV came from the prefix cache",
        sum(c.matched_tokens for c in caches),
    )
    yield counter(
        "inferflux_prefix_evictions",
        "Prefix cache entries evicted (LRU)",
        sum(c.evictions for c in caches),
    )
    yield gauge(
        "inferflux_prefix_hit_rate",
        "Hits / lookups since start (0 before the first lookup)",
        hits / (hits + misses) if hits + misses else 0.0,
    )
    yield gauge(
        "inferflux_prefix_cached_tokens",
        "Tokens held by the prefix cache now",
        sum(c.cached_tokens for c in caches),
    )
    yield gauge(
        "inferflux_prefix_parked_tokens",
        "Tokens of finished requests kept in their own sequence slots now",
        sum(c.parked_tokens for c in caches),
    )


def _kv_tiers(tiers: list[KvTiersView]) -> Iterator[Metric]:
    """Bytes and entries per tier, hits per tier, restores, refusals (absent when off)."""
    if not tiers:
        return
    gauge, counter = GaugeMetricFamily, CounterMetricFamily
    families = (
        ("inferflux_kv_tier_bytes", "Bytes held by a prefix-cache tier", "bytes", gauge),
        ("inferflux_kv_tier_entries", "Entries in a prefix-cache tier", "entries", gauge),
        ("inferflux_kv_tier_hits", "Restores served by a prefix-cache tier", "hits", counter),
        ("inferflux_kv_tier_evictions", "LRU evictions out of a tier", "evictions", counter),
    )
    for name, doc, field, family_type in families:
        family = family_type(name, doc, labels=["tier"])
        for tier in ("host", "disk"):
            family.add_metric([tier], sum(getattr(t, f"{tier}_{field}") for t in tiers))
        yield family
    yield counter(
        "inferflux_kv_restores",
        "Lower-tier cache entries loaded back into a sequence",
        sum(t.restores for t in tiers),
    )
    yield counter(
        "inferflux_kv_refusals",
        "KV blobs refused on load (corrupt, another model or layout); recomputed instead",
        sum(t.refusals for t in tiers),
    )
    yield counter(
        "inferflux_kv_restores_skipped",
        "Lower-tier hits not restored because recomputing was estimated cheaper",
        sum(t.skipped for t in tiers),
    )
    yield counter(
        "inferflux_kv_dropped_writes",
        "Evicted entries dropped because the disk write queue was full",
        sum(t.dropped_writes for t in tiers),
    )
    yield counter(
        "inferflux_kv_disk_write_errors",
        "Disk-tier writes that failed (disk full, read-only); the entries were dropped",
        sum(t.write_errors for t in tiers),
    )


def _images(images: list[ImagesView]) -> Iterator[Metric]:
    """Images encoded by the workers (models with an mmproj); none for text-only models."""
    if not images:
        return
    yield counter(
        "inferflux_multimodal_worker_images",
        "Images of prompts prepared by the workers (an image reused from memory counts)",
        sum(i.num_images_total for i in images),
    )
    yield counter(
        "inferflux_multimodal_encode_seconds",
        "Seconds the workers spent decoding image files and running the vision tower",
        sum(i.encode_seconds_total for i in images),
    )
    yield gauge(
        "inferflux_multimodal_preparing_requests",
        "Requests whose images are being encoded now",
        sum(i.num_preparing for i in images),
    )
    yield gauge(
        "inferflux_multimodal_embedding_bytes",
        "Image embedding rows the workers keep (for live requests, or to reuse)",
        sum(i.rows_bytes for i in images),
    )


def _speculative(specs: list[SpeculativeView]) -> Iterator[Metric]:
    """Speculative decoding (spec names); rates are 0 before the first draft."""
    chunks = sum(s.chunks for s in specs)
    drafted = sum(s.drafted_tokens for s in specs)
    accepted = sum(s.accepted_tokens for s in specs)
    yield counter("inferflux_spec_chunks", "Speculative drafts verified", chunks)
    yield counter(
        "inferflux_spec_chunks_accepted",
        "Speculative drafts accepted whole",
        sum(s.chunks_accepted for s in specs),
    )
    yield counter("inferflux_spec_drafted_tokens", "Tokens drafted", drafted)
    yield counter(
        "inferflux_spec_tokens_reused", "Drafted tokens accepted into the output", accepted
    )
    yield gauge(
        "inferflux_spec_acceptance_rate",
        "Drafted tokens accepted / drafted since start",
        accepted / drafted if drafted else 0.0,
    )
    yield gauge(
        "inferflux_spec_tokens_per_verification",
        "Tokens a speculating sequence emits per verified step (1 + accepted / drafts): "
        "the decode-step speedup before the cost of the extra rows",
        1.0 + accepted / chunks if chunks else 0.0,
    )


def _liveness(workers: Sequence[WorkerView]) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "inferflux_worker_up", "1 while the engine worker takes requests", labels=["worker"]
    )
    restarts = CounterMetricFamily(
        "inferflux_worker_restarts", "Times the worker was restarted", labels=["worker"]
    )
    load = GaugeMetricFamily(
        "inferflux_model_load_seconds",
        "How long the worker took to load the model at its last start",
        labels=["worker"],
    )
    hangs = CounterMetricFamily(
        "inferflux_worker_hangs",
        "Times the worker stopped answering health pings and was killed and replaced",
        labels=["worker"],
    )
    backend = GaugeMetricFamily(
        "inferflux_worker_backend_info",
        "Always 1; `backend` is where the worker's model runs, `requested` what "
        "runtime.n_gpu_layers asked for (they differ after a GPU → CPU fallback)",
        labels=["worker", "backend", "requested"],
    )
    for w in workers:
        worker = str(w.worker_id)
        up.add_metric([worker], 1.0 if w.ready else 0.0)
        backend.add_metric([worker, w.backend, w.requested_backend], 1.0)
        restarts.add_metric([worker], w.restarts)
        hangs.add_metric([worker], w.hangs)
        if w.load_s is not None:
            load.add_metric([worker], w.load_s)
    yield up
    yield restarts
    yield hangs
    yield load
    yield backend


def _routing(workers: Sequence[WorkerView]) -> Metric:
    """Routing decisions summed over workers. A decision is counted on the worker it
    chose; a `memory_aware` refusal on the worker that had the most free cells."""
    totals: dict[tuple[str, str], int] = {}
    for w in workers:
        if w.routing is not None:
            for labels, n in w.routing.decisions.items():
                totals[labels] = totals.get(labels, 0) + n
    family = CounterMetricFamily(
        "inferflux_routing_decisions",
        "Workers picked for generations, by scheduler.routing strategy and outcome "
        "(affinity, balanced, least_loaded, round_robin, memory_aware, refused)",
        labels=["strategy", "outcome"],
    )
    for (strategy, outcome), n in sorted(totals.items()):
        family.add_metric([strategy, outcome], n)
    return family
