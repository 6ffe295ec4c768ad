"""Priority queues, aging, queue timeouts, the batching window and fairness (pure logic).

Each scenario drives `Scheduler.schedule()` with a manual clock and checks the exact state
after every step.
"""

from __future__ import annotations

from inferflux.scheduler import Request, RequestId, Scheduler, SchedulerOutput, SeqId
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import KvCopy, KvFree, PriorityClass

HIGH, NORMAL, LOW = PriorityClass.HIGH, PriorityClass.NORMAL, PriorityClass.LOW


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def req(
    rid: str,
    clock: ManualClock,
    priority: PriorityClass = NORMAL,
    n: int = 2,
    max_tokens: int = 500,
) -> Request:
    return Request(
        request_id=RequestId(rid),
        prompt_token_ids=list(range(10, 10 + n)),
        max_tokens=max_tokens,
        priority=priority,
        arrival_at=clock.now,
    )


def scheduler(clock: ManualClock, seqs: int = 1, **policy: object) -> Scheduler:
    return Scheduler(
        max_num_seqs=seqs,
        max_batch_tokens=64,
        kv_capacity=None,
        policy=SchedulingPolicy(**policy),  # type: ignore[arg-type]
        clock=clock,
    )


def run(out: SchedulerOutput, token: int = 7) -> list[str]:
    """Complete one step like EngineCore; returns the ids that ran."""
    for chunk in out.chunks:
        chunk.request.num_computed_tokens += len(chunk.token_ids)
        if chunk.sample:
            chunk.request.output_token_ids.append(token)
    return [c.request.request_id for c in out.chunks]


def admitted_order(sched: Scheduler, clock: ManualClock) -> list[str]:
    """Admit one at a time (1 slot): finish whatever runs, then schedule."""
    order = []
    while sched.has_work():
        out = sched.schedule()
        ran = run(out)
        order.append(ran[0])
        sched.finish(RequestId(ran[0]))
        clock.now += 0.01
    return order


def test_high_before_normal_before_low_and_fifo_within_a_class() -> None:
    clock = ManualClock()
    sched = scheduler(clock, enable_preemption=False)
    for rid, prio in [("l1", LOW), ("n1", NORMAL), ("h1", HIGH), ("n2", NORMAL), ("h2", HIGH)]:
        sched.add(req(rid, clock, prio))
        clock.now += 0.001
    assert [r.request_id for r in sched.waiting] == ["h1", "h2", "n1", "n2", "l1"]
    assert admitted_order(sched, clock) == ["h1", "h2", "n1", "n2", "l1"]
    assert sched.num_waiting_by_class() == {HIGH: 0, NORMAL: 0, LOW: 0}


def test_aging_bounds_the_wait_of_low_priority_under_a_stream_of_high_requests() -> None:
    """A LOW request that has waited 2 × aging_s ranks by arrival among HIGH ones."""
    clock = ManualClock()
    sched = scheduler(clock, aging_s=1.0, enable_preemption=False)
    sched.add(req("low", clock, LOW))
    order: list[str] = []
    for i in range(40):  # a new HIGH request every 0.1 s, one admitted per 0.1 s
        clock.now += 0.1
        sched.add(req(f"h{i}", clock, HIGH))
        out = sched.schedule()
        ran = run(out)
        order.append(ran[0])
        sched.finish(RequestId(ran[0]))
        if ran[0] == "low":
            break
    waited = clock.now - 1000.0
    assert "low" in order
    assert waited <= 2 * 1.0 + 0.1 + 1e-9
    # every HIGH admitted before it arrived earlier than the point it fully aged
    assert order[-1] == "low" and len(order) <= 21


def test_without_aging_low_priority_waits_while_high_requests_keep_coming() -> None:
    clock = ManualClock()
    sched = scheduler(clock, aging_s=0.0, enable_preemption=False)
    sched.add(req("low", clock, LOW))
    for i in range(30):
        clock.now += 0.1
        sched.add(req(f"h{i}", clock, HIGH))
        ran = run(sched.schedule())
        assert ran != ["low"]
        sched.finish(RequestId(ran[0]))


def test_queue_timeout_drops_never_started_requests_and_never_runs_them() -> None:
    clock = ManualClock()
    sched = scheduler(clock, queue_timeout_s=5.0)
    sched.add(req("a", clock))
    sched.add(req("b", clock))
    assert run(sched.schedule()) == ["a"]
    clock.now += 4.0
    out = sched.schedule()
    assert out.timed_out == [] and run(out) == ["a"]
    clock.now += 1.5
    out = sched.schedule()
    assert [r.request_id for r in out.timed_out] == ["b"]
    assert sched.get(RequestId("b")) is None and sched.num_waiting == 0
    assert sched.counters.timeouts == 1
    sched.finish(RequestId("a"))
    assert sched.schedule().empty  # b is gone for good


def test_batching_window_holds_the_first_admission_of_an_idle_engine() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=4, batch_window_s=0.05)
    sched.add(req("a", clock))
    out = sched.schedule()
    assert out.empty and abs(out.wait_s - 0.05) < 1e-9
    clock.now += 0.02
    sched.add(req("b", clock))
    assert abs(sched.idle_wait_s() - 0.03) < 1e-9
    clock.now += 0.031
    assert run(sched.schedule()) == ["a", "b"]  # one batch
    sched.add(req("c", clock))
    assert run(sched.schedule()) == ["a", "b", "c"]  # running engine: no window


def test_batching_window_ends_early_for_a_full_batch_or_a_high_priority_request() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=2, batch_window_s=1.0)
    sched.add(req("a", clock))
    assert sched.schedule().empty
    sched.add(req("b", clock))
    assert run(sched.schedule()) == ["a", "b"]  # 2 = max_num_seqs: full
    clock2 = ManualClock()
    sched2 = scheduler(clock2, seqs=4, batch_window_s=1.0)
    sched2.add(req("h", clock2, HIGH))
    assert run(sched2.schedule()) == ["h"]


def test_high_priority_preempts_the_newest_lower_running_request_which_resumes_later() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=2)
    sched.add(req("low-old", clock, LOW))
    clock.now += 0.001
    sched.add(req("low-new", clock, LOW))
    for _ in range(16):  # both decode 16 tokens: preemptible
        run(sched.schedule())
    sched.add(req("high", clock, HIGH))
    out = sched.schedule()
    assert [r.request_id for r in out.preempted] == ["low-new"]
    assert out.kv_ops == [KvFree(SeqId(1))]  # no prefix cache: its KV is dropped
    assert run(out) == ["high"]  # low-old stands aside for the high prompt's step
    assert run(sched.schedule()) == ["low-old", "high"]
    victim = sched.get(RequestId("low-new"))
    assert victim is not None and victim.seq_id is None and victim.num_computed_tokens == 0
    assert len(victim.output_token_ids) == 16  # kept: nothing is lost
    assert sched.counters.preemptions == 1
    sched.finish(RequestId("high"))
    out = sched.schedule()
    assert run(out) == ["low-old", "low-new"]
    resumed = out.chunks[1]
    # recomputes prompt + the 15 generated tokens that had KV + the pending one
    assert resumed.start_pos == 0 and len(resumed.token_ids) == 2 + 16 and resumed.sample
    assert sched.counters.resumes == 1


def test_a_resumed_request_is_not_preempted_again_before_it_made_progress() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=1)
    sched.add(req("low", clock, LOW))
    run(sched.schedule())
    sched.add(req("high", clock, HIGH))
    out = sched.schedule()  # never preempted before: it goes at once, after one token
    assert [r.request_id for r in out.preempted] == ["low"] and run(out) == ["high"]
    sched.finish(RequestId("high"))
    run(sched.schedule())  # resumed
    sched.add(req("high-2", clock, HIGH))
    for _ in range(15):
        out = sched.schedule()
        assert out.preempted == [] and run(out) == ["low"]
    out = sched.schedule()  # 16 tokens since it resumed: now it may be preempted again
    assert [r.request_id for r in out.preempted] == ["low"] and run(out) == ["high-2"]


def test_a_prompt_still_prefilling_is_preempted_when_no_decoding_request_can_be() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=1)
    sched.add(req("low", clock, LOW, n=200))  # 4 steps of prefill at 64 tokens a step
    run(sched.schedule())
    sched.add(req("high", clock, HIGH))
    out = sched.schedule()
    assert [r.request_id for r in out.preempted] == ["low"] and run(out) == ["high"]


def test_without_preemption_a_lower_request_yields_after_its_timeslice() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=1, enable_preemption=False, max_timeslice_tokens=4)
    sched.add(req("low", clock, LOW))
    run(sched.schedule())  # prefill + 1st token
    sched.add(req("normal", clock, NORMAL))
    ran = [run(sched.schedule()) for _ in range(3)]
    assert ran == [["low"]] * 3  # 4 tokens since admission now
    out = sched.schedule()
    assert [r.request_id for r in out.preempted] == ["low"] and run(out) == ["normal"]
    assert sched.counters.yields == 1 and sched.counters.preemptions == 0


def test_equal_priorities_never_preempt_each_other() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=1, max_timeslice_tokens=2)
    sched.add(req("a", clock, NORMAL))
    sched.add(req("b", clock, NORMAL))
    for _ in range(20):
        out = sched.schedule()
        assert out.preempted == [] and run(out) == ["a"]


def test_a_preempted_request_goes_through_the_prefix_cache_and_resumes_from_it() -> None:
    clock = ManualClock()
    cache = PrefixCache([2, 3], max_tokens=1000, min_match=1)
    sched = Scheduler(
        max_num_seqs=1, max_batch_tokens=64, kv_capacity=None, prefix_cache=cache, clock=clock
    )
    sched.add(req("low", clock, LOW, n=5))
    for _ in range(17):
        run(sched.schedule())
    low = sched.get(RequestId("low"))
    assert low is not None and len(low.output_token_ids) == 17
    sched.add(req("high", clock, HIGH, n=3))
    out = sched.schedule()
    # the low request's 21 computed tokens go to cache slot 2, then its slot is freed
    assert out.kv_ops[:2] == [KvCopy(SeqId(0), SeqId(2), 21), KvFree(SeqId(0))]
    run(out)
    sched.finish(RequestId("high"))
    out = sched.schedule()
    assert out.kv_ops[-1] == KvCopy(SeqId(2), SeqId(0), 21, request=low)
    (chunk,) = out.chunks
    # only the last sampled token is computed: nothing lost, nothing repeated
    assert chunk.start_pos == 21 and chunk.token_ids == [7] and chunk.sample
    assert low.num_cached_tokens == 0  # cached_tokens reports prompt reuse at first admission


def test_a_high_request_behind_an_aged_low_one_preempts_for_itself() -> None:
    """Aging ranks a long-waiting LOW request first for the slots that free up, but a
    HIGH request behind it still preempts a running LOW one and takes that slot."""
    clock = ManualClock()
    sched = scheduler(clock, seqs=1, aging_s=1.0)
    sched.add(req("running", clock, LOW))
    run(sched.schedule())
    sched.add(req("aged", clock, LOW))
    clock.now += 2.5  # "aged" now ranks as HIGH, ahead of anything that arrives later
    sched.add(req("high", clock, HIGH))
    out = sched.schedule()
    assert [r.request_id for r in out.preempted] == ["running"] and run(out) == ["high"]
    # the freed slots go by arrival: the preempted request (first to arrive), then "aged"
    assert [r.request_id for r in sched.waiting] == ["running", "aged"]
    sched.finish(RequestId("high"))
    assert run(sched.schedule()) == ["running"]


def test_a_high_request_keeps_the_slot_of_a_victim_that_aged_itself() -> None:
    """The victim goes back to the front of its queue; aged, it ranks first. It must not
    take straight back the slot it was preempted from (the HIGH request then waited one
    preemption after another: measured under 24 low streams)."""
    clock = ManualClock()
    sched = scheduler(clock, seqs=1, aging_s=1.0)
    sched.add(req("low", clock, LOW))
    for _ in range(20):
        run(sched.schedule())
    clock.now += 5  # "low" arrived 5 s ago: it ranks as HIGH, by arrival
    sched.add(req("high", clock, HIGH))
    out = sched.schedule()
    assert [r.request_id for r in out.preempted] == ["low"] and run(out) == ["high"]
    assert sched.counters.preemptions == 1
    out = sched.schedule()  # the high request decodes; no second preemption
    assert out.preempted == [] and run(out) == ["high"]


def test_a_high_request_preempts_when_an_aged_head_takes_the_only_free_slot() -> None:
    clock = ManualClock()
    sched = scheduler(clock, seqs=2, aging_s=1.0)
    sched.add(req("a", clock, LOW))
    sched.add(req("b", clock, LOW))
    run(sched.schedule())
    sched.add(req("aged", clock, LOW))
    clock.now += 2.5  # "aged" ranks first for the slot that frees up
    run(sched.schedule())
    sched.finish(RequestId("a"))
    sched.add(req("high", clock, HIGH))
    out = sched.schedule()
    # "high" preempts "b" for a slot of its own; the step that ends its prompt is its own
    assert [r.request_id for r in out.preempted] == ["b"]
    assert run(out) == ["high"]
    # the free slot goes by arrival, to "b" (it arrived with "aged", and first), in the
    # very next step: the starvation bound is untouched
    assert sorted(run(sched.schedule())) == ["b", "high"]
    assert [r.request_id for r in sched.waiting] == ["aged"]
