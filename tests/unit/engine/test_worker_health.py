"""`WorkerHealth`: when the watchdog pings a worker and when it counts as hung."""

from __future__ import annotations

from inferflux.engine.worker_health import WorkerHealth

TIMEOUT_S = 4.0
STEP_TIMEOUT_S = 60.0


def fresh() -> WorkerHealth:
    health = WorkerHealth()
    health.reset(0.0)
    return health


def hang(health: WorkerHealth, now: float) -> str | None:
    return health.hang(now, TIMEOUT_S, STEP_TIMEOUT_S)


def test_one_ping_is_outstanding_at_a_time() -> None:
    health = fresh()
    assert health.next_ping(0.2) == 1
    assert health.next_ping(0.4) is None  # still waiting for the answer
    assert health.answered(1, 0.0, 0.5) is True
    assert health.next_ping(0.6) == 2


def test_a_stale_pong_is_a_sign_of_life_but_answers_nothing() -> None:
    health = fresh()
    health.next_ping(0.2)
    assert health.answered(0, 0.0, 3.0) is False
    assert health.heard_at == 3.0
    assert health.ping_sent_at == 0.2


def test_silent_past_the_deadline_is_a_hang() -> None:
    health = fresh()
    assert hang(health, 100.0) is None  # no ping outstanding: nothing to judge
    health.next_ping(0.2)
    assert hang(health, 4.1) is None
    reason = hang(health, 4.3)
    assert reason is not None and "runtime.worker_hang_timeout_s" in reason


def test_any_message_counts_as_an_answer() -> None:
    health = fresh()
    health.next_ping(0.2)
    health.heard(3.0)  # a StepOutputs arrived; the pong is on its way
    assert hang(health, 5.0) is None
    assert hang(health, 7.1) is not None


def test_a_slow_step_is_not_a_hang_until_the_step_deadline() -> None:
    health = fresh()
    for second in range(1, 60):  # answered every second, in one step all along
        health.next_ping(second - 0.1)
        assert health.answered(health.ping_seq, float(second), float(second))
        assert hang(health, second + 0.1) is None
    health.next_ping(60.9)
    health.answered(health.ping_seq, 61.0, 61.0)
    reason = hang(health, 61.1)
    assert reason is not None and "runtime.worker_step_timeout_s" in reason


def test_deadlines_of_zero_are_off() -> None:
    health = fresh()
    health.next_ping(0.2)
    health.answered(health.ping_seq, 1000.0, 0.3)
    health.next_ping(0.4)
    assert health.hang(5000.0, 0.0, 0.0) is None


def test_a_replacement_starts_with_nothing_outstanding() -> None:
    health = fresh()
    health.next_ping(0.2)
    health.hangs += 1
    health.reset(10.0)
    assert hang(health, 12.0) is None
    assert health.next_ping(10.2) == 2
    assert health.hangs == 1 and health.busy_s == 0.0


def test_a_ping_that_could_not_be_sent_is_not_outstanding() -> None:
    health = fresh()
    health.next_ping(0.2)
    health.unsent()  # no peer yet: the worker's heartbeat is still connecting
    assert hang(health, 10.0) is None
    assert health.next_ping(10.0) == 2
