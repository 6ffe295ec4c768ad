"""Every InferFlux Prometheus metric: the one registry module (no metric objects elsewhere).

Owns: `Metrics`, which creates every metric of one app on its own `CollectorRegistry`
(tests build many apps in one process), the histogram buckets, and `WorkerCollector`,
which turns the latest per-worker engine state into gauges and counters at scrape time.
Does not own: where the numbers come from. The API process's exporter
(`api/telemetry.py`) calls the `observe_*` / `count_*` verbs with values taken from HTTP
requests, engine deltas and the engine's per-step `StepStats`.

Naming (prometheus.io): `inferflux_` prefix, base units (`_seconds`), counters end in
`_total`; the OBS-1 names of the product requirements are kept exactly
(docs/observability.md). Labels are bounded: `model`, `route` (the route template, never
the raw path), `status`, `priority`, `finish_reason`, `backend`, `worker` (an index below
runtime.workers), `strategy` (scheduler.routing), and the security labels `kind`,
`outcome`, `mode`, `stage`, `rule`, `action` (fixed small sets); never a key, a user, a
tenant or a prompt.
docs/observability.md lists every metric.

Worker counters (prefix cache, fairness) are summed over workers; a restarted worker
starts its counters again at 0, which Prometheus' `rate()` treats as a counter reset.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib import metadata
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferflux import __version__

PRIORITIES = ("high", "normal", "low")

# Request-scale latencies: 5 ms (a cached one-token answer) to 10 min (a long generation
# on CPU). Used for request latency, TTFT, queue wait, prefill and decode durations.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
# Per-token and per-step latencies: 1 ms (a GPU decode step) to 5 s (a CPU prefill chunk).
STEP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
BATCH_SEQS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKENS_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Guardrail verdicts: 50 µs (a blocklist scan of one delta) to 2.5 s (an OPA timeout).
VERDICT_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
)  # fmt: skip


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
    def stats(self) -> EngineStatsView: ...
    @property
    def routing(self) -> RoutingView | None: ...


def build_info() -> dict[str, str]:
    """The `inferflux_build_info` labels: this package's version, Python's, and the
    installed llama-cpp-python's (read from its metadata: nothing is imported)."""
    try:
        llama_cpp = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        llama_cpp = "none"
    return {
        "version": __version__,
        "python_version": platform.python_version(),
        "llama_cpp_python": llama_cpp,
    }


class Metrics:
    """Every metric of one app, registered on `self.registry`.

    The methods are the exporter's verbs; each touches only prometheus_client objects,
    which are thread-safe. `model` labels every request-level series.
    """

    def __init__(
        self,
        *,
        model: str,
        info: Mapping[str, str],
        workers: Callable[[], Sequence[WorkerView]],
    ) -> None:
        # NOTE: process-wide in prometheus_client: no `*_created` series (they double the
        # exposition and no InferFlux query uses them).
        disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in the library
        self.model = model
        self.registry = CollectorRegistry(auto_describe=False)
        self._init_http()
        self._init_generation()
        self._init_engine()
        self._init_security()
        info_gauge = Gauge(
            "inferflux_backend_info",
            "Always 1; the labels say which backend, device and mode serve the model",
            labelnames=sorted(info),
            registry=self.registry,
        )
        info_gauge.labels(**info).set(1)
        build = build_info()
        build_gauge = Gauge(
            "inferflux_build_info",
            "Always 1; the labels say which InferFlux, Python and llama-cpp-python run",
            labelnames=sorted(build),
            registry=self.registry,
        )
        build_gauge.labels(**build).set(1)
        self.registry.register(WorkerCollector(workers))

    def _init_http(self) -> None:
        labels = ("model", "route", "status")
        self.request_latency = Histogram(
            "inferflux_request_latency_seconds",
            "End-to-end HTTP request latency, until the last byte of the response (streams "
            "included)",
            labelnames=labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "inferflux_requests_total",
            "HTTP requests answered, by route template and status code",
            labelnames=labels,
            registry=self.registry,
        )
        self.request_errors = Counter(
            "inferflux_request_errors_total",
            "HTTP requests answered with a status of 400 or above",
            labelnames=labels,
            registry=self.registry,
        )
        self.requests_in_flight = Gauge(
            "inferflux_requests_in_flight",
            "HTTP requests being answered now",
            registry=self.registry,
        )

    def _init_generation(self) -> None:
        def counter(name: str, doc: str, *extra: str) -> Counter:
            labels = ("model", *extra)
            return Counter(name, doc, labelnames=labels, registry=self.registry)

        self.ttft = Histogram(
            "inferflux_time_to_first_token_seconds",
            "From the HTTP request's arrival to the first generated token",
            labelnames=("model",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "inferflux_inter_token_latency_seconds",
            "Time between two consecutive outputs of one request (one token per engine step)",
            labelnames=("model",),
            buckets=STEP_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = counter("inferflux_prompt_tokens_total", "Prompt tokens submitted")
        self.generation_tokens = counter(
            "inferflux_generation_tokens_total", "Tokens generated (sampled)"
        )
        self.generations = counter(
            "inferflux_generations_total",
            "Generations that ended, by engine finish reason",
            "finish_reason",
        )
        self.stream_tokens = counter(
            "inferflux_stream_tokens_total", "Generated tokens delivered in streaming responses"
        )
        self.stream_cache_hits = counter(
            "inferflux_stream_cache_hits_total",
            "Streaming generations whose prompt reused KV from the prefix cache",
        )
        self.multimodal_images = counter(
            "inferflux_multimodal_images_total",
            "Images preprocessed across all requests (0 until image input is supported)",
        )
        self.multimodal_requests = counter(
            "inferflux_multimodal_requests_total",
            "Requests with at least one image input (0 until image input is supported)",
        )
        self.moe_requests = counter(
            "inferflux_moe_requests_total",
            "Requests routed to a mixture-of-experts model (GGUF <arch>.expert_count > 0)",
        )
        # Present (at 0) before the first request, so dashboards and alerts see the series.
        for family in (
            self.ttft,
            self.itl,
            self.prompt_tokens,
            self.generation_tokens,
            self.stream_tokens,
            self.stream_cache_hits,
            self.multimodal_images,
            self.multimodal_requests,
            self.moe_requests,
        ):
            family.labels(model=self.model)

    def _init_engine(self) -> None:
        def histogram(name: str, doc: str, buckets: Sequence[float], *labels: str) -> Histogram:
            return Histogram(name, doc, labelnames=labels, buckets=buckets, registry=self.registry)

        self.queue_wait = histogram(
            "inferflux_queue_wait_seconds",
            "From enqueue in a worker to the request's first batch",
            LATENCY_BUCKETS,
            "priority",
        )
        self.batch_exec = histogram(
            "inferflux_batch_exec_seconds",
            "Wall time of one engine step: schedule, one llama_decode, sampling",
            STEP_BUCKETS,
        )
        self.batch_size = histogram(
            "inferflux_batch_size", "Sequences in one engine step", BATCH_SEQS_BUCKETS
        )
        self.batch_tokens = histogram(
            "inferflux_batch_tokens",
            "Tokens in one engine step (decode tokens plus prompt chunks)",
            BATCH_TOKENS_BUCKETS,
        )
        self.prefill_duration = histogram(
            "inferflux_prefill_duration_seconds",
            "From a request's first batch to its first token (prompt processing)",
            LATENCY_BUCKETS,
            "priority",
        )
        self.decode_duration = histogram(
            "inferflux_decode_duration_seconds",
            "From a request's first token to its last",
            LATENCY_BUCKETS,
            "priority",
        )
        self.prefill_tokens = Counter(
            "inferflux_prefill_tokens_total",
            "Prompt tokens the engine computed (prefix-cache hits excluded)",
            registry=self.registry,
        )
        for priority in PRIORITIES:
            for family in (self.queue_wait, self.prefill_duration, self.decode_duration):
                family.labels(priority=priority)

    def _init_security(self) -> None:
        """Rate limits and guardrails (issue 6). Labels: `kind` (requests, tokens,
        concurrency), `outcome`, `mode`, `stage` (input, output), `rule` (blocklist,
        blocklist_regex, pii:<kind>, opa), `action` — all bounded sets."""
        self.rate_limit_decisions = Counter(
            "inferflux_rate_limit_decisions_total",
            "Rate-limit checks, by limit kind and outcome (allowed, rejected)",
            labelnames=("kind", "outcome"),
            registry=self.registry,
        )
        self.rate_limit_redis_failures = Counter(
            "inferflux_rate_limit_redis_failures_total",
            "Rate-limit calls to Redis that failed or timed out",
            registry=self.registry,
        )
        self.rate_limit_fallbacks = Counter(
            "inferflux_rate_limit_fallback_decisions_total",
            "Admissions decided without Redis, by rate_limit.redis_failure_mode",
            labelnames=("mode",),
            registry=self.registry,
        )
        self.rate_limit_redis_up = Gauge(
            "inferflux_rate_limit_redis_up",
            "1 while the shared rate-limit store answers (0 during an outage; absent "
            "without redis.url)",
            registry=self.registry,
        )
        self.audit_lines_dropped = Counter(
            "inferflux_audit_lines_dropped_total",
            "Audit lines a sink could not write (disk full, read-only), dropped",
            registry=self.registry,
        )
        self.guardrail_verdict = Histogram(
            "inferflux_guardrail_verdict_seconds",
            "Time to a guardrail verdict: the whole input chain (OPA included) per prompt, "
            "or one output scan per streamed delta",
            labelnames=("stage",),
            buckets=VERDICT_BUCKETS,
            registry=self.registry,
        )
        self.guardrail_decisions = Counter(
            "inferflux_guardrail_decisions_total",
            "Guardrail findings and decisions, by stage, rule and action",
            labelnames=("stage", "rule", "action"),
            registry=self.registry,
        )
        for stage in ("input", "output"):
            self.guardrail_verdict.labels(stage=stage)

    def watch_policy(
        self, version: Callable[[], int], replication: Callable[[], ReplicationView] | None
    ) -> None:
        """Export the running policy version, and with policy replication (`replication`
        not None) whether Redis answers and the last replicated change's lag."""
        self.registry.register(PolicyCollector(version, replication))

    def watch_model_replication(
        self, version: Callable[[], int], failed: Callable[[], int]
    ) -> None:
        """Export the admin-loaded models' replicated version and how many of its models
        failed to load here (api/model_sync.py)."""
        self.registry.register(ModelReplicationCollector(version, failed))

    # -- the exporter's verbs -------------------------------------------------------------
    def observe_request(self, route: str, status: int, latency_s: float) -> None:
        labels = (self.model, route, str(status))
        self.request_latency.labels(*labels).observe(latency_s)
        self.requests.labels(*labels).inc()
        if status >= 400:
            self.request_errors.labels(*labels).inc()

    def observe_step(self, exec_s: float, num_seqs: int, num_tokens: int) -> None:
        self.batch_exec.observe(exec_s)
        self.batch_size.observe(num_seqs)
        self.batch_tokens.observe(num_tokens)

    def observe_phases(
        self, priority: str, prefill_s: float | None, decode_s: float | None
    ) -> None:
        if prefill_s is not None:
            self.prefill_duration.labels(priority).observe(prefill_s)
        if decode_s is not None:
            self.decode_duration.labels(priority).observe(decode_s)


class ReplicationView(Protocol):
    """What the collector reads of policy replication (security `PolicySyncStatus`)."""

    @property
    def redis_up(self) -> bool: ...
    @property
    def lag_s(self) -> float | None: ...


class PolicyCollector(Collector):
    """`inferflux_policy_version`, and with replication `inferflux_policy_sync_redis_up`
    and `inferflux_policy_replication_lag_seconds`, read at scrape time."""

    def __init__(
        self, version: Callable[[], int], replication: Callable[[], ReplicationView] | None
    ) -> None:
        self._version = version
        self._replication = replication

    def collect(self) -> Iterator[Metric]:
        yield _gauge(
            "inferflux_policy_version",
            "Version of the security policy this replica runs (keys, tenants, limits, "
            "guardrails); replicas that share a Redis converge on one version",
            self._version(),
        )
        if self._replication is None:
            return
        status = self._replication()
        yield _gauge(
            "inferflux_policy_sync_redis_up",
            "1 while policy replication reaches Redis (0: serving the policy held, admin "
            "changes refused)",
            1.0 if status.redis_up else 0.0,
        )
        if status.lag_s is not None:
            yield _gauge(
                "inferflux_policy_replication_lag_seconds",
                "From another replica's publish (Redis clock) to apply here, of the last "
                "replicated policy change this replica applied",
                status.lag_s,
            )


class ModelReplicationCollector(Collector):
    """`inferflux_model_replication_version` and `inferflux_model_replication_failed`,
    read at scrape time."""

    def __init__(self, version: Callable[[], int], failed: Callable[[], int]) -> None:
        self._version = version
        self._failed = failed

    def collect(self) -> Iterator[Metric]:
        yield _gauge(
            "inferflux_model_replication_version",
            "Version of the admin-loaded models this replica applied; replicas that share "
            "a Redis converge on one version",
            self._version(),
        )
        yield _gauge(
            "inferflux_model_replication_failed",
            "Models of that version this replica could not load (see /server/stats "
            "model_replication.failed)",
            self._failed(),
        )


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
        yield from _liveness(workers)
        yield _routing(workers)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _scheduler(stats: list[EngineStatsView]) -> Iterator[Metric]:
    waiting = sum(s.num_waiting for s in stats)
    yield _gauge(
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
    yield _gauge("inferflux_waiting_sequences", "Sequences waiting for a batch slot", waiting)
    yield _gauge(
        "inferflux_running_sequences", "Sequences decoding now", sum(s.num_running for s in stats)
    )
    used = sum(s.kv_cells_used for s in stats)
    total = sum(s.kv_cells_total for s in stats)
    yield _gauge("inferflux_kv_cells_used", "KV cells in use by running sequences", used)
    yield _gauge("inferflux_kv_cells_total", "KV cells allocated", total)
    yield _gauge(
        "inferflux_kv_usage_ratio", "kv_cells_used / kv_cells_total (0 before load)",
        used / total if total else 0.0,
    )  # fmt: skip
    yield _counter(
        "inferflux_decode_failures",
        "llama_decode calls that failed (no KV room or an error); the step was retried "
        "after evicting the prefix cache and splitting the batch",
        sum(s.decode_failures for s in stats),
    )
    yield _gauge(
        "inferflux_memory_pressure",
        "1 while a worker's host memory is below scheduler.memory_low_mb (admissions and "
        "step budget halved)",
        float(any(s.memory_pressure for s in stats)),
    )
    yield _counter(
        "inferflux_memory_pressure_episodes",
        "Times a worker entered memory pressure (its prefix cache was evicted)",
        sum(s.memory_pressure_episodes for s in stats),
    )
    known = [s.host_memory_available_bytes for s in stats if s.host_memory_available_bytes >= 0]
    if known:
        yield _gauge(
            "inferflux_host_memory_available_bytes",
            "Memory the host (or the container's cgroup limit) has left, as the workers read it",
            float(min(known)),
        )


def _fairness(f: list[FairnessView]) -> Iterator[Metric]:
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
    for p in PRIORITIES:
        tokens.add_metric([p], sum(x.tokens.get(p, 0) for x in f))
    yield tokens


def _prefix(caches: list[PrefixCacheView]) -> Iterator[Metric]:
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
    yield _counter(
        "inferflux_kv_restores",
        "Lower-tier cache entries loaded back into a sequence",
        sum(t.restores for t in tiers),
    )
    yield _counter(
        "inferflux_kv_refusals",
        "KV blobs refused on load (corrupt, another model or layout); recomputed instead",
        sum(t.refusals for t in tiers),
    )
    yield _counter(
        "inferflux_kv_restores_skipped",
        "Lower-tier hits not restored because recomputing was estimated cheaper",
        sum(t.skipped for t in tiers),
    )
    yield _counter(
        "inferflux_kv_dropped_writes",
        "Evicted entries dropped because the disk write queue was full",
        sum(t.dropped_writes for t in tiers),
    )
    yield _counter(
        "inferflux_kv_disk_write_errors",
        "Disk-tier writes that failed (disk full, read-only); the entries were dropped",
        sum(t.write_errors for t in tiers),
    )


def _speculative(specs: list[SpeculativeView]) -> Iterator[Metric]:
    """Speculative decoding (spec names); rates are 0 before the first draft."""
    chunks = sum(s.chunks for s in specs)
    drafted = sum(s.drafted_tokens for s in specs)
    accepted = sum(s.accepted_tokens for s in specs)
    yield _counter("inferflux_spec_chunks", "Speculative drafts verified", chunks)
    yield _counter(
        "inferflux_spec_chunks_accepted",
        "Speculative drafts accepted whole",
        sum(s.chunks_accepted for s in specs),
    )
    yield _counter("inferflux_spec_drafted_tokens", "Tokens drafted", drafted)
    yield _counter(
        "inferflux_spec_tokens_reused", "Drafted tokens accepted into the output", accepted
    )
    yield _gauge(
        "inferflux_spec_acceptance_rate",
        "Drafted tokens accepted / drafted since start",
        accepted / drafted if drafted else 0.0,
    )
    yield _gauge(
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
