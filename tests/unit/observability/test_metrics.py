"""The metrics registry: every OBS-1 name with its spec type, worker sums, bounded labels.

Parsed with prometheus_client's own text parser, as a scraper would read it.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from importlib import metadata

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import inferflux
from inferflux.engine.messages import EngineStats, FairnessStats, PrefixCacheStats
from inferflux.engine.routing import WorkerRouting
from inferflux.observability.metrics import LATENCY_BUCKETS, STEP_BUCKETS, Metrics

# the product requirements' "Required Prometheus Metrics (OBS-1)" (docs/observability.md)
OBS1 = {
    "inferflux_request_latency_seconds": "histogram",
    "inferflux_queue_wait_seconds": "histogram",
    "inferflux_batch_exec_seconds": "histogram",
    "inferflux_prefill_duration_seconds": "histogram",
    "inferflux_decode_duration_seconds": "histogram",
    "inferflux_scheduler_queue_depth": "gauge",
    "inferflux_prefix_hits": "counter",
    "inferflux_prefix_misses": "counter",
    "inferflux_prefix_matched_tokens": "counter",
    "inferflux_prefix_partial_hits": "counter",
    "inferflux_fairness_preemptions": "counter",
    "inferflux_fairness_yields": "counter",
    "inferflux_fairness_interrupts": "counter",
    "inferflux_fairness_resumes": "counter",
    "inferflux_fairness_tokens": "counter",
    "inferflux_multimodal_images": "counter",
    "inferflux_multimodal_requests": "counter",
}


@dataclass
class Worker:
    worker_id: int
    ready: bool = True
    restarts: int = 0
    load_s: float | None = 1.5
    hangs: int = 0
    backend: str = "cpu"
    requested_backend: str = "cpu"
    role: str = "unified"
    stats: EngineStats = field(default_factory=EngineStats)
    routing: WorkerRouting | None = None


def families(metrics: Metrics) -> dict:
    text = generate_latest(metrics.registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict, sample_name: str, **labels: str) -> float:
    for fam in fams.values():
        for sample in fam.samples:
            if sample.name == sample_name and sample.labels == labels:
                return sample.value
    raise KeyError((sample_name, labels))


def make(workers: list[Worker] | None = None) -> Metrics:
    return Metrics(
        model="m", info={"backend": "llama.cpp", "mode": "workers"}, workers=lambda: workers or []
    )


def test_every_obs1_metric_is_exported_with_its_spec_type() -> None:
    metrics = make([Worker(0)])
    metrics.observe_request("/v1/chat/completions", 200, 0.2)
    metrics.observe_step(0.01, 2, 40)
    fams = families(metrics)
    for name, kind in OBS1.items():
        assert name in fams, name
        assert fams[name].type == kind, name


def test_histograms_use_the_documented_buckets() -> None:
    metrics = make()
    metrics.observe_request("/healthz", 200, 0.003)
    fams = families(metrics)
    bounds = [
        s.labels["le"]
        for s in fams["inferflux_request_latency_seconds"].samples
        if s.name.endswith("_bucket")
    ]
    assert bounds == [str(b) for b in LATENCY_BUCKETS] + ["+Inf"]
    assert value(fams, "inferflux_request_latency_seconds_bucket",
                 model="m", route="/healthz", status="200", le="0.005") == 1  # fmt: skip
    itl = fams["inferflux_inter_token_latency_seconds"]
    assert [s.labels["le"] for s in itl.samples if s.name.endswith("_bucket")][:-1] == [
        str(b) for b in STEP_BUCKETS
    ]


def test_request_counters_split_errors_by_status() -> None:
    metrics = make()
    metrics.observe_request("/v1/completions", 200, 0.1)
    metrics.observe_request("/v1/completions", 400, 0.01)
    metrics.observe_request("/v1/completions", 503, 0.01)
    fams = families(metrics)
    labels = {"model": "m", "route": "/v1/completions"}
    assert value(fams, "inferflux_requests_total", **labels, status="200") == 1
    assert value(fams, "inferflux_request_errors_total", **labels, status="400") == 1
    assert value(fams, "inferflux_request_errors_total", **labels, status="503") == 1
    with pytest.raises(KeyError):
        value(fams, "inferflux_request_errors_total", **labels, status="200")


def test_worker_state_is_summed_over_workers() -> None:
    a = Worker(0, stats=EngineStats(num_running=2, num_waiting=3, kv_cells_used=100,
                                     kv_cells_total=400, waiting_by_priority={"high": 1, "low": 2},
                                     fairness=FairnessStats(preemptions=1, tokens={"normal": 5}),
                                     prefix_cache=PrefixCacheStats(hits=3, misses=1,
                                                                   parked_tokens=40)))  # fmt: skip
    b = Worker(1, ready=False, restarts=2, load_s=None, hangs=1,
               stats=EngineStats(num_waiting=1, kv_cells_total=400, waiting_by_priority={"low": 1},
                                 fairness=FairnessStats(preemptions=2, tokens={"normal": 7}),
                                 prefix_cache=PrefixCacheStats(hits=1, misses=3,
                                                               parked_tokens=2)))  # fmt: skip
    fams = families(make([a, b]))
    assert value(fams, "inferflux_scheduler_queue_depth") == 4
    assert value(fams, "inferflux_scheduler_queue_depth_by_priority", priority="low") == 3
    assert value(fams, "inferflux_scheduler_queue_depth_by_priority", priority="normal") == 0
    assert value(fams, "inferflux_running_sequences") == 2
    assert value(fams, "inferflux_kv_usage_ratio") == 100 / 800
    assert value(fams, "inferflux_fairness_preemptions_total") == 3
    assert value(fams, "inferflux_fairness_tokens_total", priority="normal") == 12
    assert value(fams, "inferflux_prefix_hits_total") == 4
    assert value(fams, "inferflux_prefix_hit_rate") == 0.5
    assert value(fams, "inferflux_prefix_parked_tokens") == 42
    assert value(fams, "inferflux_worker_up", worker="0") == 1
    assert value(fams, "inferflux_worker_up", worker="1") == 0
    assert value(fams, "inferflux_worker_restarts_total", worker="1") == 2
    assert value(fams, "inferflux_worker_hangs_total", worker="1") == 1
    assert value(fams, "inferflux_worker_hangs_total", worker="0") == 0
    assert value(fams, "inferflux_model_load_seconds", worker="0") == 1.5
    with pytest.raises(KeyError):  # never loaded: no sample rather than a made-up 0
        value(fams, "inferflux_model_load_seconds", worker="1")


def test_each_worker_reports_its_backend_and_the_requested_one() -> None:
    """A GPU → CPU fallback shows as backend cpu, requested cuda (engine/backends/offload.py)."""
    fams = families(make([Worker(0), Worker(1, backend="cpu", requested_backend="cuda")]))
    name = "inferflux_worker_backend_info"
    assert value(fams, name, worker="0", backend="cpu", requested="cpu") == 1
    assert value(fams, name, worker="1", backend="cpu", requested="cuda") == 1


def test_routing_decisions_are_summed_over_workers_by_strategy_and_outcome() -> None:
    def routing(decisions: dict[tuple[str, str], int]) -> WorkerRouting:
        return WorkerRouting(decisions=decisions, affinity_tokens=0, indexed_blocks=0)

    a = Worker(0, routing=routing({("prefix_affinity", "affinity"): 3}))
    b = Worker(
        1, routing=routing({("prefix_affinity", "affinity"): 2, ("round_robin", "round_robin"): 1})
    )
    fams = families(make([a, b, Worker(2)]))
    name = "inferflux_routing_decisions_total"
    assert value(fams, name, strategy="prefix_affinity", outcome="affinity") == 5
    assert value(fams, name, strategy="round_robin", outcome="round_robin") == 1


def test_series_exist_at_zero_before_traffic() -> None:
    fams = families(make())
    for name in (
        "inferflux_multimodal_images_total",
        "inferflux_multimodal_requests_total",
        "inferflux_moe_requests_total",
        "inferflux_generation_tokens_total",
        "inferflux_stream_tokens_total",
        "inferflux_stream_cache_hits_total",
    ):
        assert value(fams, name, model="m") == 0, name
    assert value(fams, "inferflux_time_to_first_token_seconds_count", model="m") == 0
    assert value(fams, "inferflux_queue_wait_seconds_count", priority="low") == 0
    assert value(fams, "inferflux_backend_info", backend="llama.cpp", mode="workers") == 1


def test_labels_stay_bounded() -> None:
    """No series carries a label outside the documented, bounded set."""
    metrics = make([Worker(0)])
    metrics.observe_request("/v1/chat/completions", 200, 0.2)
    metrics.observe_phases("high", 0.1, 0.2)
    allowed = {"model", "route", "status", "priority", "finish_reason", "worker", "le"}
    allowed |= {"backend", "mode"}  # the info gauge only
    allowed |= {"requested"}  # inferflux_worker_backend_info (with worker, backend)
    allowed |= {"version", "python_version", "llama_cpp_python"}  # inferflux_build_info only
    # security: kind (requests/tokens/concurrency), outcome, mode (failure mode), stage
    # (input/output), rule (blocklist, blocklist_regex, pii:<kind>, opa), action
    allowed |= {"kind", "outcome", "stage", "rule", "action"}
    allowed |= {"strategy"}  # routing decisions (with outcome)
    for fam in families(metrics).values():
        for sample in fam.samples:
            assert set(sample.labels) <= allowed, (sample.name, sample.labels)


def test_build_info_carries_the_package_version() -> None:
    fams = families(make())
    labels = {
        "version": inferflux.__version__,
        "python_version": platform.python_version(),
        "llama_cpp_python": metadata.version("llama-cpp-python"),
    }
    assert value(fams, "inferflux_build_info", **labels) == 1
    assert inferflux.__version__ == metadata.version("inferflux")  # one source: __init__


def test_observe_phases_skips_phases_a_request_never_had() -> None:
    metrics = make()
    metrics.observe_phases("normal", None, None)
    metrics.observe_phases("normal", 0.5, None)
    fams = families(metrics)
    assert value(fams, "inferflux_prefill_duration_seconds_count", priority="normal") == 1
    assert value(fams, "inferflux_decode_duration_seconds_count", priority="normal") == 0


def test_memory_faults_are_summed_and_pressure_is_any_worker() -> None:
    a = Worker(0, stats=EngineStats(decode_failures=2, memory_pressure=True,
                                     memory_pressure_episodes=1,
                                     host_memory_available_bytes=100 << 20))  # fmt: skip
    b = Worker(1, stats=EngineStats(decode_failures=1, host_memory_available_bytes=300 << 20))
    fams = families(make([a, b]))
    assert value(fams, "inferflux_decode_failures_total") == 3
    assert value(fams, "inferflux_memory_pressure") == 1
    assert value(fams, "inferflux_memory_pressure_episodes_total") == 1
    assert value(fams, "inferflux_host_memory_available_bytes") == 100 << 20
    idle = families(make([Worker(0, stats=EngineStats())]))
    assert value(idle, "inferflux_memory_pressure") == 0
    with pytest.raises(KeyError):  # no worker has read its memory yet
        value(idle, "inferflux_host_memory_available_bytes")


def test_kv_tiers_are_summed_per_tier_and_absent_without_tiers() -> None:
    from inferflux.engine.messages import KvTierStats

    tiers_a = KvTierStats(host_bytes=100, host_entries=1, disk_bytes=50, disk_entries=2,
                          host_hits=3, disk_hits=1, restores=4, refusals=1, skipped=2,
                          host_evictions=5, dropped_writes=1, write_errors=3)  # fmt: skip
    tiers_b = KvTierStats(host_bytes=10, disk_hits=2, restores=2, write_errors=1)
    fams = families(make([Worker(0, stats=EngineStats(kv_tiers=tiers_a)),
                          Worker(1, stats=EngineStats(kv_tiers=tiers_b))]))  # fmt: skip
    assert value(fams, "inferflux_kv_tier_bytes", tier="host") == 110
    assert value(fams, "inferflux_kv_tier_bytes", tier="disk") == 50
    assert value(fams, "inferflux_kv_tier_entries", tier="disk") == 2
    assert value(fams, "inferflux_kv_tier_hits_total", tier="disk") == 3
    assert value(fams, "inferflux_kv_tier_evictions_total", tier="host") == 5
    assert value(fams, "inferflux_kv_restores_total") == 6
    assert value(fams, "inferflux_kv_refusals_total") == 1
    assert value(fams, "inferflux_kv_restores_skipped_total") == 2
    assert value(fams, "inferflux_kv_dropped_writes_total") == 1
    assert value(fams, "inferflux_kv_disk_write_errors_total") == 4
    with pytest.raises(KeyError):
        value(families(make([Worker(0)])), "inferflux_kv_restores_total")


def test_dropped_audit_lines_reach_their_counter() -> None:
    from inferflux.api.security_layer import SecurityEvents
    from inferflux.config.security_settings import AuditSettings
    from inferflux.security.audit import make_audit_log

    metrics = make()
    events = SecurityEvents(metrics)
    # /dev/full: every write fails with ENOSPC, as on a full disk
    audit = make_audit_log(AuditSettings(path="/dev/full"), events.on_audit_dropped)
    assert audit is not None
    assert value(families(metrics), "inferflux_audit_lines_dropped_total") == 0
    audit.write({"event": "test"})
    audit.write({"event": "test"})
    audit.close()  # the final flush fails too: not raised
    assert value(families(metrics), "inferflux_audit_lines_dropped_total") == 2
