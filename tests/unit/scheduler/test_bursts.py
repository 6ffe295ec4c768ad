"""Prompt bursts (`SchedulingPolicy.burst_stall_s`): while prompts are prefilled the
decoding streams stand aside, so each pauses once per burst instead of once per prompt
step; prompts go shortest first, and a step ends where a prompt ends when the cost model
says so (pure logic: steps are described, not run; the clock is the test's)."""

from __future__ import annotations

from inferflux.scheduler import Scheduler
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.request import PriorityClass, Request, SchedulerOutput
from inferflux.scheduler.step_cost import StepCostModel
from tests.unit.scheduler.test_priorities import NORMAL, ManualClock, req
from tests.unit.scheduler.test_scheduler import complete

# A 2-core CPU running SmolLM2: 10 ms a step, 5 ms a decoding row, 2 ms a prompt token.
CPU_COST = [0.010, 0.005, 0.002, 0.004]
# A GPU: a step costs 8 ms whatever it carries, a prompt token 10 µs.
GPU_COST = [0.008, 0.0002, 0.00001, 0.002]


def _request(rid: str, n: int, clock: ManualClock, priority: PriorityClass = NORMAL) -> Request:
    return req(rid, clock, priority, n, max_tokens=100)


def _scheduler(
    clock: ManualClock, cost: list[float] = CPU_COST, n_decoding: int = 2, **policy: float
) -> Scheduler:
    """`n_decoding` streams past their prompts, bursts on (10 s) unless `policy` says."""
    sched = Scheduler(
        max_num_seqs=8,
        max_batch_tokens=512,
        kv_capacity=None,
        policy=SchedulingPolicy(**{"burst_stall_s": 10.0, **policy}),  # type: ignore[arg-type]
        clock=clock,
    )
    sched.step_cost = StepCostModel(theta=list(cost))
    for i in range(n_decoding):
        sched.add(_request(f"d{i}", 4, clock))
    complete(sched.schedule())
    return sched


def _rows(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(c.request.request_id, len(c.token_ids)) for c in out.chunks]


def test_streams_pause_once_for_a_burst_of_prompts_then_decode() -> None:
    clock = ManualClock()
    sched = _scheduler(clock)
    sched.add(_request("long", 300, clock))
    sched.add(_request("short", 40, clock))
    steps = []
    for _ in range(3):
        out = sched.schedule()
        steps.append(_rows(out))
        complete(out)
        clock.now += 0.3
    assert steps == [
        [("short", 40)],  # shortest first, the step ends where its prompt ends
        [("long", 300)],  # the streams still stand aside: one pause for both prompts
        [("d0", 1), ("d1", 1), ("long", 1), ("short", 1)],
    ]
    assert [len(r.output_token_ids) for r in sched.running] == [2, 2, 2, 2]


def test_off_each_prompt_step_carries_every_streams_token() -> None:
    clock = ManualClock()
    sched = _scheduler(clock, burst_stall_s=0.0)
    sched.add(_request("long", 300, clock))
    sched.add(_request("short", 40, clock))
    out = sched.schedule()
    assert _rows(out) == [("d0", 1), ("d1", 1), ("long", 300), ("short", 40)]


def test_where_a_step_costs_the_same_whatever_it_carries_prompts_share_it() -> None:
    clock = ManualClock()
    sched = _scheduler(clock, cost=GPU_COST)
    sched.add(_request("long", 300, clock))
    sched.add(_request("short", 40, clock))
    assert _rows(sched.schedule()) == [("short", 40), ("long", 300)]


def test_the_split_pays_when_a_token_costs_more_than_a_step_per_later_prompt() -> None:
    cpu, gpu = StepCostModel(theta=list(CPU_COST)), StepCostModel(theta=list(GPU_COST))
    assert cpu.split_pays(300, 1) and cpu.split_pays(300, 7)
    assert not cpu.split_pays(3, 7)  # 6 ms earlier for one, 14 ms later for seven
    assert not gpu.split_pays(300, 1)  # 3 ms earlier against 10 ms later


def test_past_the_stall_bound_the_streams_get_a_token_then_may_pause_again() -> None:
    clock = ManualClock()
    sched = _scheduler(clock, burst_stall_s=1.0)
    sched.add(_request("huge", 2000, clock))
    seen = []
    for _ in range(5):
        out = sched.schedule()
        seen.append(sorted({c.request.request_id for c in out.chunks}))
        complete(out)
        clock.now += 0.6  # a 512-token step on the CPU above takes about a second
    assert seen == [
        ["huge"],
        ["huge"],
        ["d0", "d1", "huge"],  # 1.2 s stood aside: this step carries their tokens
        ["huge"],  # a new pause: the last 466 tokens, and its first token
        ["d0", "d1", "huge"],  # the prompt is in: all three decode
    ]


def test_high_priority_streams_never_stand_aside() -> None:
    clock = ManualClock()
    sched = _scheduler(clock, n_decoding=0)
    sched.add(_request("hi", 4, clock, PriorityClass.HIGH))
    sched.add(_request("lo", 4, clock))
    while any(not r.output_token_ids for r in sched.running) or sched.num_waiting:
        complete(sched.schedule())
    sched.add(_request("new", 100, clock))
    assert _rows(sched.schedule()) == [("hi", 1), ("new", 100)]


def test_a_prompt_that_waited_aging_s_goes_before_shorter_ones() -> None:
    clock = ManualClock()
    clock.now = 10.0
    sched = _scheduler(clock, aging_s=5.0)
    old, short = _request("old", 300, clock), _request("short", 40, clock)
    old.arrival_at, short.arrival_at = 4.0, 9.9  # old waited 6 s, e.g. behind busy slots
    sched.add(old)
    sched.add(short)
    assert _rows(sched.schedule()) == [("old", 300)]


def test_prompts_that_aged_together_still_go_shortest_first() -> None:
    """A wave of clients that arrived at once ages at once: their prompts keep the
    shortest-first order (before, aged prompts went by arrival, which among a wave is
    arbitrary: the late half of a 32-prompt burst lost it, BENCHMARKS nineteenth)."""
    clock = ManualClock()
    clock.now = 10.0
    sched = _scheduler(clock, aging_s=5.0)
    wave = [_request(f"w{n}", n, clock) for n in (300, 120, 200)]
    late = _request("late", 40, clock)
    for i, request in enumerate(wave):
        request.arrival_at = 4.0 + 0.001 * i  # the same instant, give or take
    late.arrival_at = 4.9  # aged too, but it came 0.9 s later: its 40 tokens take 0.08 s
    for request in [*wave, late]:
        sched.add(request)
    order = []
    for _ in range(4):
        out = sched.schedule()
        order += [rid for rid, _ in _rows(out) if not rid.startswith("d")]
        complete(out)
    assert order == ["w120", "w200", "w300", "late"]


def test_every_waiting_request_that_fits_is_admitted_at_the_bursts_first_step() -> None:
    clock = ManualClock()
    sched = _scheduler(clock, n_decoding=0)
    for i, n in enumerate([200, 120, 40]):
        sched.add(_request(f"p{i}", n, clock))
    out = sched.schedule()
    assert _rows(out) == [("p2", 40)]
    assert [r.request_id for r in sched.running] == ["p0", "p1", "p2"]  # arrival order
    assert sched.num_waiting == 0


def test_a_stall_free_target_keeps_the_streams_decoding_every_step() -> None:
    clock = ManualClock()
    sched = _scheduler(clock, itl_target_ratio=3.0)
    sched.add(_request("long", 300, clock))
    rows = _rows(sched.schedule())
    assert rows[:2] == [("d0", 1), ("d1", 1)] and rows[2][0] == "long"


def test_with_no_prompt_that_can_start_the_streams_keep_decoding() -> None:
    clock = ManualClock()
    sched = Scheduler(
        max_num_seqs=2,
        max_batch_tokens=512,
        kv_capacity=None,
        policy=SchedulingPolicy(burst_stall_s=10.0, enable_preemption=False),
        clock=clock,
    )
    for i in range(2):
        sched.add(_request(f"d{i}", 4, clock))
    complete(sched.schedule())
    sched.add(_request("queued", 50, clock))  # no free slot
    assert _rows(sched.schedule()) == [("d0", 1), ("d1", 1)]
