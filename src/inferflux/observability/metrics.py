"""Every InferFlux Prometheus metric: the one registry module (no metric objects elsewhere).

Owns: `Metrics`, which creates every metric of one app on its own `CollectorRegistry`
(tests build many apps in one process), and the histogram buckets. `WorkerCollector`
(observability/worker_metrics.py) turns the latest per-worker engine state into gauges
and counters at scrape time, `DisaggCollector` (observability/disagg_metrics.py) the KV
channel's and tickets' in disaggregated mode; `Metrics` registers both.
Does not own: where the numbers come from. The API process's exporter
(`api/telemetry.py`) calls the `observe_*` / `count_*` verbs with values taken from HTTP
requests, engine deltas and the engine's per-step `StepStats`.

Naming (prometheus.io): `inferflux_` prefix, base units (`_seconds`), counters end in
`_total`; the OBS-1 names of the product requirements are kept exactly
(docs/observability.md). Labels are bounded: `model`, `route` (the route template, never
the raw path), `status`, `priority`, `finish_reason`, `backend`, `worker` (an index below
runtime.workers), `strategy` (scheduler.routing), `phase` (prefill, decode), `role` (a
worker's pool), and the security labels `kind`, `outcome`, `mode`, `stage`, `rule`,
`action` (fixed small sets); never a key, a user, a tenant or a prompt.
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
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from inferflux import __version__
from inferflux.observability.disagg_metrics import TRANSFER_BUCKETS, ChannelView, DisaggCollector
from inferflux.observability.worker_metrics import PRIORITIES, WorkerCollector, WorkerView, gauge

# Request-scale latencies: 5 ms (a cached one-token answer) to 10 min (a long generation
# on CPU). Used for request latency, TTFT, queue wait, prefill and decode durations.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
# Per-token and per-step latencies: 1 ms (a GPU decode step) to 5 s (a CPU prefill chunk).
STEP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
# Image files: 1 KiB to 64 MiB; images: a thumbnail (4 kpx) to 64 MP.
IMAGE_BYTES_BUCKETS = tuple(float(4**k * 1024) for k in range(10))
IMAGE_PIXELS_BUCKETS = tuple(float(4**k * 4096) for k in range(9))
BATCH_SEQS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_TOKENS_BUCKETS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Guardrail verdicts: 50 µs (a blocklist scan of one delta) to 2.5 s (an OPA timeout).
VERDICT_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
)  # fmt: skip


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
        channels: Callable[[], Sequence[ChannelView]] = tuple,
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
        self.registry.register(DisaggCollector(workers, channels))
        self.kv_transfer: Histogram | None = None  # disaggregated mode (init_transfer)

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
            "Time between two consecutive outputs of one streamed request (one token per step)",
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
            "Images taken by the API (fetched or decoded from base64, sniffed and probed)",
        )
        self.multimodal_requests = counter(
            "inferflux_multimodal_requests_total",
            "Requests with at least one image input",
        )
        self.moe_requests = counter(
            "inferflux_moe_requests_total",
            "Requests routed to a mixture-of-experts model (GGUF <arch>.expert_count > 0)",
        )
        self._init_multimodal()
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
            self.image_preprocess,
            self.image_bytes,
            self.image_pixels,
        ):
            family.labels(model=self.model)

    def _init_multimodal(self) -> None:
        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            labels = ("model",)
            return Histogram(name, doc, labelnames=labels, buckets=buckets, registry=self.registry)

        self.image_preprocess = histogram(
            "inferflux_multimodal_preprocess_seconds",
            "API-side time per image: URL fetch (if any), base64 already decoded, sniff and "
            "header probe",
            STEP_BUCKETS + (10.0, 30.0),
        )
        self.image_bytes = histogram(
            "inferflux_multimodal_image_bytes",
            "Size of each image file taken, in bytes",
            IMAGE_BYTES_BUCKETS,
        )
        self.image_pixels = histogram(
            "inferflux_multimodal_image_pixels",
            "Pixels (width x height) of each image taken, read from its header",
            IMAGE_PIXELS_BUCKETS,
        )

    def observe_image(self, preprocess_s: float, num_bytes: int, num_pixels: int) -> None:
        """One image the API took: its preprocessing time, file size and pixel count."""
        self.multimodal_images.labels(self.model).inc()
        self.image_preprocess.labels(self.model).observe(preprocess_s)
        self.image_bytes.labels(self.model).observe(num_bytes)
        self.image_pixels.labels(self.model).observe(num_pixels)

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

    def init_transfer(self) -> Histogram:
        """The KV transfer histogram, registered on first use (disaggregated mode only:
        unified mode exports no such family)."""
        if self.kv_transfer is None:
            self.kv_transfer = Histogram(
                "inferflux_kv_transfer_seconds",
                "From a KV ticket's enqueue (the prefill worker wrote it) to hydrated in a "
                "decode worker's sequence",
                buckets=TRANSFER_BUCKETS,
                registry=self.registry,
            )
        return self.kv_transfer

    def observe_transfers(self, transfer_s: Sequence[float]) -> None:
        """A decode worker's hand-offs since its previous step message."""
        histogram = self.init_transfer()
        for seconds in transfer_s:
            histogram.observe(seconds)

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
        yield gauge(
            "inferflux_policy_version",
            "Version of the security policy this replica runs (keys, tenants, limits, "
            "guardrails); replicas that share a Redis converge on one version",
            self._version(),
        )
        if self._replication is None:
            return
        status = self._replication()
        yield gauge(
            "inferflux_policy_sync_redis_up",
            "1 while policy replication reaches Redis (0: serving the policy held, admin "
            "changes refused)",
            1.0 if status.redis_up else 0.0,
        )
        if status.lag_s is not None:
            yield gauge(
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
        yield gauge(
            "inferflux_model_replication_version",
            "Version of the admin-loaded models this replica applied; replicas that share "
            "a Redis converge on one version",
            self._version(),
        )
        yield gauge(
            "inferflux_model_replication_failed",
            "Models of that version this replica could not load (see /server/stats "
            "model_replication.failed)",
            self._failed(),
        )
