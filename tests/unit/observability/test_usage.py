"""The usage ledger: per-minute buckets, windows, grouping, the row bound."""

from __future__ import annotations

from inferflux.observability.usage import OTHER, UsageLedger


class Clock:
    def __init__(self) -> None:
        self.now = 60.0 * 1_000_000

    def __call__(self) -> float:
        return self.now


def test_rows_group_by_the_named_fields_most_tokens_first():
    clock = Clock()
    ledger = UsageLedger(clock=clock)
    ledger.add("k1", "acme", "smol", 10, 5)
    ledger.add("k1", "acme", "smol", 10, 5)
    ledger.add("k2", "acme", "gemma", 100, 50)
    rows = ledger.query(3600, ("key", "tenant", "model"))
    assert [(r.key, r.model, r.counts.num_requests) for r in rows] == [
        ("k2", "gemma", 1),
        ("k1", "smol", 2),
    ]
    (tenant,) = ledger.query(3600, ("tenant",))
    assert (tenant.key, tenant.tenant, tenant.model) == (None, "acme", None)
    assert tenant.counts.num_prompt_tokens == 120
    assert tenant.counts.num_completion_tokens == 60


def test_windows_count_whole_minutes_and_old_buckets_fall_off():
    clock = Clock()
    ledger = UsageLedger(horizon_s=3600, clock=clock)
    ledger.add("k", "t", "m", 1, 1)
    clock.now += 600  # ten minutes later
    ledger.add("k", "t", "m", 2, 2)
    assert ledger.query(300, ("key",))[0].counts.num_requests == 1
    assert ledger.query(3600, ("key",))[0].counts.num_requests == 2
    assert [c.num_requests for _, c in ledger.series(3600)] == [1, 1]
    for _ in range(61):  # an hour of minutes, one request each: the first buckets fall off
        clock.now += 60
        ledger.add("k", "t", "m", 0, 0)
    assert ledger.query(86400, ("key",))[0].counts.num_requests == 60


def test_rows_past_the_bound_are_summed_under_other():
    ledger = UsageLedger(max_rows=2, clock=Clock())
    for key in ("a", "b", "c", "d"):
        ledger.add(key, "t", "m", 1, 0)
    keys = {r.key: r.counts.num_requests for r in ledger.query(300, ("key",))}
    assert keys == {"a": 1, "b": 1, OTHER: 2}
