"""`DisaggCollector` and the transfer histogram on `Metrics`: the channels of several models
summed, ticket counters only from workers that have them, nothing in unified mode."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferflux.engine.messages import TicketStats
from inferflux.engine.protocol import ChannelStats, WorkerStatus
from inferflux.observability.disagg_metrics import TRANSFER_BUCKETS
from inferflux.observability.metrics import Metrics
from tests.fakes.engine import fake_channel, pool_status


def scrape(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def make(workers: list[WorkerStatus], channels: list[ChannelStats]) -> Metrics:
    info = {"backend": "llama.cpp"}
    return Metrics(model="m", info=info, workers=lambda: workers, channels=lambda: channels)


def test_two_models_channels_are_summed() -> None:
    workers = [
        pool_status(0, "prefill", tickets=TicketStats(written=3)),
        pool_status(1, "decode", num_waiting=2, tickets=TicketStats(hydrated=2, refused=1)),
        pool_status(2, "decode", num_waiting=1),  # no stats message yet: no tickets
    ]
    channels = [fake_channel(prefill_queue=1, blocked=2), fake_channel(prefill_queue=3, capacity=4)]
    samples = scrape(make(workers, channels))
    assert samples[("inferflux_disagg_queue_depth", (("phase", "prefill"),))] == 4
    assert samples[("inferflux_disagg_queue_depth", (("phase", "decode"),))] == 3
    assert samples[("inferflux_kv_channel_capacity", ())] == 12
    assert samples[("inferflux_kv_tickets_total", (("outcome", "blocked"),))] == 2
    assert samples[("inferflux_kv_tickets_written_total", ())] == 3
    assert samples[("inferflux_kv_tickets_hydrated_total", ())] == 2
    assert samples[("inferflux_kv_tickets_refused_total", ())] == 1


def test_unified_workers_export_nothing_of_it() -> None:
    metrics = make([pool_status(0, "unified")], [])
    names = {name for name, _ in scrape(metrics)}
    assert not {n for n in names if "kv_channel" in n or "kv_ticket" in n or "disagg" in n}
    assert "inferflux_worker_role_info" not in names
    assert "inferflux_kv_transfer_seconds_count" not in names


def test_the_transfer_histogram_appears_with_the_first_hand_off() -> None:
    metrics = make([], [])
    metrics.observe_transfers([0.0004, 0.0012])
    metrics.observe_transfers([6.0])
    samples = scrape(metrics)
    assert samples[("inferflux_kv_transfer_seconds_count", ())] == 3
    assert samples[("inferflux_kv_transfer_seconds_bucket", (("le", "0.0005"),))] == 1
    assert samples[("inferflux_kv_transfer_seconds_bucket", (("le", "5.0"),))] == 2
    assert metrics.init_transfer() is metrics.kv_transfer  # registered once


def test_transfer_buckets_are_fine_below_the_5_ms_target() -> None:
    assert TRANSFER_BUCKETS[0] == 0.0005 and TRANSFER_BUCKETS[-1] == 5.0
    assert list(TRANSFER_BUCKETS) == sorted(set(TRANSFER_BUCKETS))
    assert sum(1 for b in TRANSFER_BUCKETS if b <= 0.005) >= 6
