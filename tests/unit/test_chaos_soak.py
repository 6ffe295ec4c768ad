"""The soak's RSS-growth estimate (tests/chaos/soak.py): pure arithmetic over samples."""

from __future__ import annotations

import pytest

from tests.chaos.soak import rss_growth


def _samples(rss: list[float], worker: list[float]) -> list[dict[str, float]]:
    return [
        {"done": 1000.0 + 500 * i, "api": a, "worker 7": w, "fds": 30.0, "threads": 6.0}
        for i, (a, w) in enumerate(zip(rss, worker, strict=True))
    ]


def test_a_linear_leak_is_its_slope_per_10k_in_both_halves() -> None:
    api = [100.0 + 0.5 * i for i in range(10)]  # 0.5 MB per 500 requests = 10 MB per 10k
    growth = rss_growth(_samples(api, [50.0] * 10))
    assert growth["api"] == pytest.approx((10.0, 10.0))
    assert growth["worker 7"] == pytest.approx((0.0, 0.0))


def test_a_cache_that_fills_then_stays_is_flat_in_the_second_half() -> None:
    worker = [50.0, 52.0, 53.0, 53.5, 53.5, 53.5, 53.5, 53.5, 53.5, 53.5]
    slope, second_half = rss_growth(_samples([100.0] * 10, worker))["worker 7"]
    assert slope > 0
    assert second_half == pytest.approx(0.0)


def test_a_worker_replaced_during_the_soak_is_not_compared() -> None:
    samples = _samples([100.0] * 4, [50.0] * 4)
    del samples[2]["worker 7"]
    samples[2]["worker 9"] = 40.0
    assert set(rss_growth(samples)) == {"api"}
