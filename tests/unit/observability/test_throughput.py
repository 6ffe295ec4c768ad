"""ThroughputMeter: tokens per second over the last whole seconds, old buckets forgotten."""

from __future__ import annotations

from inferflux.observability.throughput import ThroughputMeter


def test_rates_over_a_window() -> None:
    meter = ThroughputMeter(horizon_s=60)
    meter.add(100, 10, now=1000.2)
    meter.add(50, 10, now=1000.9)
    meter.add(0, 20, now=1005.5)
    assert meter.rates(10, now=1005.9) == (15.0, 4.0)
    assert meter.rates(60, now=1005.9) == (2.5, 40 / 60)


def test_buckets_older_than_the_window_are_not_counted() -> None:
    meter = ThroughputMeter(horizon_s=60)
    meter.add(100, 100, now=1000.0)
    assert meter.rates(10, now=1010.5) == (0.0, 0.0)
    assert meter.rates(60, now=1010.5) == (100 / 60, 100 / 60)


def test_a_reused_ring_bucket_starts_from_zero() -> None:
    meter = ThroughputMeter(horizon_s=10)
    meter.add(7, 7, now=500.0)
    meter.add(1, 2, now=511.0)  # the same ring slot, 11 s later
    assert meter.rates(10, now=511.0) == (0.1, 0.2)


def test_window_is_clamped_to_the_horizon() -> None:
    meter = ThroughputMeter(horizon_s=5)
    meter.add(10, 0, now=100.0)
    assert meter.rates(1000, now=100.0) == (2.0, 0.0)
