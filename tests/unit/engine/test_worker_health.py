"""`WorkerHealth`: when the watchdog pings a worker and when it counts as hung."""

from __future__ import annotations

from inferflux.engine.worker_health import WorkerHealth

TIMEOUT_S = 4.0


def test_one_ping_is_outstanding_at_a_time() -> None:
    health = WorkerHealth()
    health.reset(0.0)
    assert health.next_ping(0.2) == 1
    assert health.next_ping(0.4) is None  # still waiting for the answer
    assert health.answered(1, 0.5) is True
    assert health.next_ping(0.6) == 2


def test_a_stale_pong_is_a_sign_of_life_but_answers_nothing() -> None:
    health = WorkerHealth()
    health.reset(0.0)
    health.next_ping(0.2)
    assert health.answered(0, 3.0) is False
    assert health.heard_at == 3.0
    assert health.ping_sent_at == 0.2


def test_hung_only_after_the_deadline_with_nothing_heard() -> None:
    health = WorkerHealth()
    health.reset(0.0)
    assert not health.hung(100.0, TIMEOUT_S)  # no ping outstanding: never hung
    health.next_ping(0.2)
    assert not health.hung(4.1, TIMEOUT_S)
    assert health.hung(4.3, TIMEOUT_S)


def test_a_long_step_that_sends_outputs_is_not_a_hang() -> None:
    health = WorkerHealth()
    health.reset(0.0)
    health.next_ping(0.2)
    health.heard(3.0)  # a StepOutputs arrived; the pong comes after the next step
    assert not health.hung(5.0, TIMEOUT_S)
    assert health.hung(7.1, TIMEOUT_S)


def test_a_replacement_starts_with_nothing_outstanding() -> None:
    health = WorkerHealth()
    health.reset(0.0)
    health.next_ping(0.2)
    health.hangs += 1
    health.reset(10.0)
    assert not health.hung(12.0, TIMEOUT_S)
    assert health.next_ping(10.2) == 2
    assert health.hangs == 1
