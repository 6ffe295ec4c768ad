"""engine/step_stop.py (pure logic). A request's arrival in the worker is when the API
process sent it (`AddRequest.sent_at`), so the wait for the step in flight when it came
counts as queue wait; stamps that cannot be a wait (none, the future, a clock step) are
the moment it was read. Which steps a high-priority arrival may stop, and the check they
are armed with."""

from __future__ import annotations

import time

from inferflux.engine.step_stop import MAX_INBOX_WAIT_S, arrival_at, can_stop, stop_check
from inferflux.scheduler import Scheduler
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.request import PriorityClass
from inferflux.scheduler.step_cost import StepCostModel
from tests.unit.scheduler.test_scheduler import complete, make_request


def test_a_request_sent_earlier_arrived_then() -> None:
    before = time.monotonic()
    arrival = arrival_at(time.time() - 0.5)
    assert before - 0.55 < arrival < time.monotonic() - 0.45


def test_no_stamp_means_now() -> None:
    before = time.monotonic()
    assert before <= arrival_at(0.0) <= time.monotonic()


def test_a_stamp_from_the_future_means_now() -> None:
    before = time.monotonic()
    assert before <= arrival_at(time.time() + 30) <= time.monotonic()


def test_a_clock_step_is_capped() -> None:
    before = time.monotonic()
    arrival = arrival_at(time.time() - 3600)
    assert before - MAX_INBOX_WAIT_S - 0.05 < arrival <= time.monotonic() - MAX_INBOX_WAIT_S


def _steps() -> Scheduler:
    """Two streams decoding, a low-priority prompt waiting for the next step."""
    sched = Scheduler(max_num_seqs=8, max_batch_tokens=256, kv_capacity=None)
    for i in range(2):
        sched.add(make_request(f"d{i}", 4, max_tokens=100))
    complete(sched.schedule())
    low = make_request("low", 200)
    low.priority = PriorityClass.LOW
    sched.add(low)
    return sched


def test_a_step_with_a_lower_priority_prompt_may_be_stopped() -> None:
    sched = _steps()
    out = sched.schedule()
    assert [len(c.token_ids) for c in out.chunks] == [1, 1, 200]
    assert can_stop(out.chunks, sched)
    sched.policy = SchedulingPolicy(interrupt_steps=False)
    assert not can_stop(out.chunks, sched)


def test_decode_only_steps_are_stopped_only_while_high_priority_requests_arrive() -> None:
    now = [0.0]
    sched = Scheduler(max_num_seqs=8, max_batch_tokens=256, kv_capacity=None, clock=lambda: now[0])
    for i in range(2):
        sched.add(make_request(f"d{i}", 4, max_tokens=100))
    complete(sched.schedule())
    out = sched.schedule()  # the two decode; no high-priority request came yet
    assert [len(c.token_ids) for c in out.chunks] == [1, 1]
    assert not can_stop(out.chunks, sched)
    complete(out)
    high = make_request("high", 3, max_tokens=1)
    high.priority = PriorityClass.HIGH
    sched.add(high)
    complete(sched.schedule())  # its step, alone
    sched.finish(high.request_id)
    complete(sched.schedule())  # the streams' step after it: never stopped
    out = sched.schedule()  # the two decode again, and a high-priority request came lately
    assert [c.request.request_id for c in out.chunks] == ["d0", "d1"]
    assert can_stop(out.chunks, sched)
    complete(out)
    now[0] += 31  # none for 30 s: decode-only steps are not armed any more
    out = sched.schedule()
    assert not can_stop(out.chunks, sched)


def test_quiet_decode_only_and_high_priority_steps_are_never_stopped() -> None:
    sched = _steps()
    complete(sched.schedule())
    out = sched.schedule()  # the three decode
    assert [len(c.token_ids) for c in out.chunks] == [1, 1, 1]
    assert not can_stop(out.chunks, sched)
    complete(out)
    high = make_request("high", 30, max_tokens=4)
    high.priority = PriorityClass.HIGH
    sched.add(high)
    out = sched.schedule()
    assert [c.request.request_id for c in out.chunks] == ["high"]  # the streams stand aside
    assert not can_stop(out.chunks, sched)
    complete(out)
    sched.add(make_request("normal", 50))
    out = sched.schedule()  # carries a prompt, but follows the step they stood aside for
    assert sched.after_aside and any(len(c.token_ids) > 1 for c in out.chunks)
    assert not can_stop(out.chunks, sched)


def test_the_check_stops_only_early_in_the_step_and_always_reads_the_arrivals() -> None:
    sched = _steps()
    out = sched.schedule()
    calls: list[int] = []

    def arrived() -> bool:  # a fake of the worker loop's socket read
        calls.append(1)
        return True

    sched.step_cost = StepCostModel(theta=[10.0, 0.0, 0.0, 0.0])  # a 10 s step expected
    assert stop_check(out.chunks, out.num_tokens, sched, arrived)()
    sched.step_cost = StepCostModel(theta=[0.0, 0.0, 0.0, 0.0])  # already past its time
    assert not stop_check(out.chunks, out.num_tokens, sched, arrived)()
    assert len(calls) == 2
