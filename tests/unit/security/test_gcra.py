"""LocalLimiter: GCRA per minute (burst = a minute's limit, continuous refill), weighted
costs, debts from forced charges, all-or-nothing decisions, concurrency slots."""

from __future__ import annotations

import pytest

from inferflux.security.rate_limit.gcra import Charge, LocalLimiter, Slot, retry_after, state_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> LocalLimiter:
    return LocalLimiter(clock=clock)


def rpm(limit: int, key: str = "k", cost: int = 1) -> Charge:
    return Charge(key, limit, cost, "requests")


def test_a_whole_minute_may_burst_then_refills_continuously(limiter, clock):
    for i in range(6):
        decision = limiter.acquire_now([rpm(6)], (), "m")
        assert decision.allowed
        assert decision.states[0].remaining == 5 - i
    refused = limiter.acquire_now([rpm(6)], (), "m")
    assert not refused.allowed and refused.denied == "requests"
    assert refused.retry_after_s == pytest.approx(10.0)  # one unit every 60/6 s
    clock.now += 9.9
    assert not limiter.acquire_now([rpm(6)], (), "m").allowed
    clock.now += 0.1
    assert limiter.acquire_now([rpm(6)], (), "m").allowed


def test_weighted_cost_and_reset(limiter, clock):
    tokens = Charge("t", 600, 300, "tokens")
    decision = limiter.acquire_now([tokens], (), "m")
    assert decision.states[0].remaining == 300
    assert decision.states[0].reset_s == pytest.approx(30.0)
    assert limiter.acquire_now([tokens], (), "m").allowed
    refused = limiter.acquire_now([Charge("t", 600, 1, "tokens")], (), "m")
    assert not refused.allowed and refused.denied == "tokens"
    assert refused.retry_after_s == pytest.approx(0.1)


async def test_forced_charges_go_into_debt_that_later_requests_wait_out(limiter, clock):
    states = await limiter.charge([Charge("t", 60, 90, "tokens")])
    assert states[0].remaining == 0 and states[0].reset_s == pytest.approx(90.0)
    refused = limiter.acquire_now([Charge("t", 60, 1, "tokens")], (), "m")
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(31.0)
    clock.now += 31.0
    assert limiter.acquire_now([Charge("t", 60, 1, "tokens")], (), "m").allowed


def test_a_refusal_charges_nothing_anywhere(limiter):
    assert limiter.acquire_now([rpm(1, "tenant")], (), "m").allowed
    refused = limiter.acquire_now([rpm(10, "key"), rpm(1, "tenant")], [Slot("c", 5)], "m2")
    assert not refused.allowed
    # the key's budget and the slot were not touched
    assert limiter.acquire_now([rpm(10, "key")], (), "m").states[0].remaining == 9
    assert limiter.acquire_now([], [Slot("c", 1)], "m3").allowed


async def test_concurrency_slots_are_held_until_released(limiter):
    slot = Slot("c", 2)
    assert limiter.acquire_now([], [slot], "a").allowed
    assert limiter.acquire_now([], [slot], "b").allowed
    refused = limiter.acquire_now([rpm(10)], [slot], "c")
    assert not refused.allowed and refused.denied == "concurrency"
    assert limiter.acquire_now([rpm(10)], (), "x").states[0].remaining == 9  # not charged
    await limiter.release([slot], "a")
    assert limiter.acquire_now([], [slot], "c").allowed


def test_state_and_retry_helpers():
    charge = Charge("k", 60, 5, "tokens")
    assert state_of(charge, -3.0).remaining == 60
    assert state_of(charge, 60.0).remaining == 0
    assert retry_after(charge, 58.0) == pytest.approx(3.0)
    assert retry_after(charge, 0.0) == 0.0
