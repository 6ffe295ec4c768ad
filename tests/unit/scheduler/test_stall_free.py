"""The latency-aware step budget: the online step-cost fit and the prompt cap it sets while
sequences decode (pure logic: steps are described, not run)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferflux.scheduler import RequestId, Scheduler
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.request import PriorityClass, Request
from inferflux.scheduler.step_cost import StepCostModel
from tests.unit.scheduler.test_scheduler import complete, make_request


def test_the_fit_recovers_a_machines_step_costs_from_mixed_steps() -> None:
    # intercept, per decoding sequence, per prompt token, per step that carries a prompt
    truth = (0.012, 0.004, 0.0018, 0.008)
    model = StepCostModel()
    rng = random.Random(7)
    for _ in range(300):
        decoding, tokens = rng.randint(0, 16), rng.choice([0, 0, 16, 64, 256, 512])
        cost = truth[0] + truth[1] * decoding + truth[2] * tokens + (truth[3] if tokens else 0)
        model.observe(decoding, tokens, cost + rng.gauss(0, 0.002))
    assert model.theta == pytest.approx(truth, rel=0.15)
    assert model.predict_s(8, 100) == pytest.approx(0.012 + 0.032 + 0.18 + 0.008, rel=0.05)
    assert model.predict_s(8, 0) == pytest.approx(0.012 + 0.032, rel=0.05)


def test_the_fit_follows_a_host_that_gets_slower() -> None:
    model = StepCostModel()
    for cost in (0.001, 0.003):  # the per-token cost triples (another job took the cores)
        for i in range(400):
            tokens = 32 * (i % 9)
            model.observe(4, tokens, 0.01 + 0.002 * 4 + cost * tokens)
    assert model.token_cost_s == pytest.approx(0.003, rel=0.05)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 64), st.floats(0.0, 2.0))
def test_the_prompt_budget_never_predicts_a_step_over_the_target(
    decoding: int, target_s: float
) -> None:
    model = StepCostModel(theta=[0.01, 0.003, 0.002, 0.004])
    budget = model.prompt_budget(decoding, target_s)
    assert budget >= 0
    if budget > 0:
        assert model.predict_s(decoding, budget) <= target_s + 1e-9
        assert model.predict_s(decoding, budget + 1) > target_s - 1e-9  # the largest such


def _decoding_scheduler(
    itl_target_s: float, n_decoding: int = 4, itl_target_ratio: float = 0.0
) -> Scheduler:
    """Four sequences past their prompts, a known cost model: 10 ms + 5 ms per decoding
    sequence + 1 ms per prompt token."""
    sched = Scheduler(
        max_num_seqs=40,
        max_batch_tokens=512,
        kv_capacity=None,
        policy=SchedulingPolicy(itl_target_s=itl_target_s, itl_target_ratio=itl_target_ratio),
    )
    sched.step_cost = StepCostModel(theta=[0.010, 0.005, 0.001, 0.0])
    for i in range(n_decoding):
        sched.add(make_request(f"d{i}", 4, max_tokens=100))
    complete(sched.schedule())
    return sched


def test_off_a_long_prompt_takes_the_whole_budget_beside_decoding_sequences() -> None:
    sched = _decoding_scheduler(0.0)
    sched.add(make_request("long", 2000))
    out = sched.schedule()
    assert [len(c.token_ids) for c in out.chunks] == [1, 1, 1, 1, 508]


def test_under_a_target_a_long_prompt_is_prefilled_in_steps_that_fit_it() -> None:
    sched = _decoding_scheduler(0.150)  # 150 ms - 10 - 4 × 5 = 120 ms of prompt: 120 tokens
    long = make_request("long", 2000)
    sched.add(long)
    sizes = []
    for _ in range(3):
        out = sched.schedule()
        assert [len(c.token_ids) for c in out.chunks[:4]] == [1, 1, 1, 1]  # decodes first
        sizes.append(len(out.chunks[4].token_ids))
        complete(out)
    assert sizes == [120, 120, 120]
    assert long.num_computed_tokens == 360


def test_a_target_protects_streamed_sequences_only() -> None:
    # four collected requests decode (stream: false): nobody reads a token before their
    # end, so a long prompt beside them takes the whole budget, as with no target
    sched = _decoding_scheduler(0.150)
    for request in sched.running:
        request.streamed = False
    sched.add(make_request("long", 2000))
    out = sched.schedule()
    assert [len(c.token_ids) for c in out.chunks] == [1, 1, 1, 1, 508]
    complete(out)
    # one streamed request among them: the step is held to the target again
    sched.running[0].streamed = True
    out = sched.schedule()
    assert [len(c.token_ids) for c in out.chunks] == [1, 1, 1, 1, 120]


def test_a_high_priority_prompt_is_not_capped_and_the_others_stand_aside() -> None:
    sched = _decoding_scheduler(0.150)
    high = make_request("high", 2000)
    high.priority = PriorityClass.HIGH
    normal = make_request("normal", 2000)
    sched.add(high)
    sched.add(normal)
    out = sched.schedule()
    # the whole budget left after the 4 decodes, and nothing for the normal prompt
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks[4:]] == [("high", 508)]
    complete(out)
    sched.finish(high.request_id)
    out = sched.schedule()
    # alone, the normal prompt gets the normal share
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks[4:]] == [("normal", 120)]


def test_a_high_priority_arrival_pauses_a_long_low_priority_prefill_for_one_step() -> None:
    sched = _decoding_scheduler(0.0)  # no ITL target: the low prompt takes whole steps
    low = make_request("low", 2000)
    low.priority = PriorityClass.LOW
    sched.add(low)
    complete(sched.schedule())
    sched.add(_high("high", 60))
    out = sched.schedule()
    # the step that ends the high prompt carries nothing else: the four streams stand
    # aside for it (high_prefill_alone)
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [("high", 60)]
    assert out.chunks[-1].sample  # its first token comes from this very step
    complete(out)
    out = sched.schedule()  # the streams and the high request decode; the low prompt goes
    # on, in small chunks while high-priority requests keep arriving (high_traffic_chunk_tokens)
    assert [len(c.token_ids) for c in out.chunks[:4]] == [1, 1, 1, 1]
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks[4:]] == [
        ("high", 1),
        ("low", 128),
    ]


def _high(rid: str, n: int, max_tokens: int = 4) -> Request:
    """A HIGH-class request with an `n`-token prompt."""
    request = make_request(rid, n, max_tokens=max_tokens)
    request.priority = PriorityClass.HIGH
    return request


def test_only_the_step_that_ends_a_long_high_priority_prompt_stands_the_streams_aside() -> None:
    sched = _decoding_scheduler(0.0)
    sched.add(_high("high", 700))
    out = sched.schedule()  # 700 tokens do not fit the step: the streams decode beside it
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [
        *((f"d{i}", 1) for i in range(4)),
        ("high", 508),
    ]
    complete(out)
    out = sched.schedule()  # the rest ends it: this step is its own
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [("high", 192)]


def test_high_priority_streams_keep_their_rows_in_another_high_prompts_step() -> None:
    sched = _decoding_scheduler(0.0, n_decoding=2)
    sched.add(_high("high-1", 8, max_tokens=50))
    complete(sched.schedule())  # high-1's step
    complete(sched.schedule())  # high-1 decodes beside the streams
    sched.add(_high("high-2", 30))
    out = sched.schedule()
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [
        ("high-1", 1),
        ("high-2", 30),
    ]


def test_the_streams_never_stand_aside_two_steps_in_a_row() -> None:
    sched = _decoding_scheduler(0.0)
    for name in ("high-1", "high-2"):
        sched.add(_high(name, 30))
    out = sched.schedule()  # both HIGH prompts end in this step, which is theirs alone
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [
        ("high-1", 30),
        ("high-2", 30),
    ]
    assert not sched.after_aside
    complete(out)
    sched.add(_high("high-3", 30))
    out = sched.schedule()  # the streams waited the step before: they decode in this one
    assert sched.after_aside  # and EngineCore does not stop it
    assert [len(c.token_ids) for c in out.chunks[:4]] == [1, 1, 1, 1]


def test_with_high_prefill_alone_off_the_streams_decode_beside_the_high_prompt() -> None:
    sched = _decoding_scheduler(0.0)
    sched.policy = SchedulingPolicy(high_prefill_alone=False)
    sched.add(_high("high", 60))
    out = sched.schedule()
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [
        *((f"d{i}", 1) for i in range(4)),
        ("high", 60),
    ]


def _after_a_high_request(policy: SchedulingPolicy) -> tuple[Scheduler, list[float]]:
    """A scheduler that served one high-priority request at t = 0, with a long low
    prompt waiting."""
    now = [0.0]
    sched = Scheduler(
        max_num_seqs=8,
        max_batch_tokens=512,
        kv_capacity=None,
        policy=policy,
        clock=lambda: now[0],
    )
    sched.add(_high("high", 10, max_tokens=1))
    complete(sched.schedule())
    sched.finish(RequestId("high"))
    low = make_request("low", 4000)
    low.priority = PriorityClass.LOW
    sched.add(low)
    return sched, now


def test_other_prompts_take_whole_steps_again_once_high_traffic_stops() -> None:
    sched, now = _after_a_high_request(SchedulingPolicy())
    assert [len(c.token_ids) for c in sched.schedule().chunks] == [128]
    now[0] = 29.0
    assert [len(c.token_ids) for c in sched.schedule().chunks] == [128]
    now[0] = 31.0  # no high-priority arrival for 30 s
    assert [len(c.token_ids) for c in sched.schedule().chunks] == [512]
    sched, now = _after_a_high_request(SchedulingPolicy(high_traffic_chunk_tokens=0))
    assert [len(c.token_ids) for c in sched.schedule().chunks] == [512]  # off


def _aged_low_then_high(
    *, admit_low: bool, n_high: int = 100
) -> tuple[Scheduler, list[float], Request]:
    """A 2000-token LOW prompt that arrived at t = 0 (admitted at once with `admit_low`),
    then at t = 2.5, when it ranks as HIGH by two aging periods, an `n_high`-token HIGH
    one."""
    now = [0.0]
    sched = Scheduler(
        max_num_seqs=8,
        max_batch_tokens=512,
        kv_capacity=None,
        policy=SchedulingPolicy(aging_s=1.0),
        clock=lambda: now[0],
    )
    low = make_request("low", 2000)
    low.priority = PriorityClass.LOW
    low.arrival_at = 0.0
    sched.add(low)
    if admit_low:
        complete(sched.schedule())
    now[0] = 2.5
    high = make_request("high", n_high)
    high.priority = PriorityClass.HIGH
    high.arrival_at = now[0]
    sched.add(high)
    return sched, now, high


def test_a_prompt_aged_to_the_high_class_progresses_in_small_chunks_beside_a_high_one() -> None:
    sched, now, high = _aged_low_then_high(admit_low=True, n_high=700)
    out = sched.schedule()
    # it does not stand aside (the starvation bound), but the high prompt takes the step
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [
        ("low", 16),
        ("high", 496),
    ]
    complete(out)
    out = sched.schedule()
    # the step that ends the high prompt is its own (high_prefill_alone)
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [("high", 204)]
    complete(out)
    sched.finish(high.request_id)
    now[0] += 31  # alone again, and no high-priority arrival for 30 s: the whole budget
    out = sched.schedule()
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [("low", 512)]


def test_a_high_prompt_that_cannot_be_admitted_does_not_stop_the_others() -> None:
    sched = Scheduler(
        max_num_seqs=1,
        max_batch_tokens=64,
        kv_capacity=None,
        policy=SchedulingPolicy(enable_preemption=False, max_timeslice_tokens=10_000),
    )
    low = make_request("low", 200)
    low.priority = PriorityClass.LOW
    sched.add(low)
    complete(sched.schedule())
    high = make_request("high", 10)
    high.priority = PriorityClass.HIGH
    sched.add(high)
    out = sched.schedule()  # no free slot and no preemption: the low prompt goes on
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [("low", 64)]


def test_prompts_still_progress_when_decoding_alone_exceeds_the_target() -> None:
    sched = _decoding_scheduler(0.020)  # 10 ms + 4 × 5 ms = 30 ms > 20 ms
    sched.add(make_request("long", 500))
    out = sched.schedule()
    assert len(out.chunks[4].token_ids) == 16


def test_a_prompt_backlog_is_drained_in_32_steps_whatever_the_target() -> None:
    sched = _decoding_scheduler(0.020)  # the target alone would allow 16 tokens a step
    sched.add(make_request("a", 1500))
    sched.add(make_request("b", 1700))  # 3,200 tokens waiting: 100 a step
    out = sched.schedule()
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks[4:]] == [("a", 100)]
    complete(out)
    out = sched.schedule()  # 3,100 left: 97 a step
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks[4:]] == [("a", 97)]


@pytest.mark.parametrize(
    ("n_decoding", "expected"),
    [
        (4, 30),  # 2 × (10 + 4 × 5) ms = 60 ms: 30 ms of prompt
        (32, 170),  # 2 × (10 + 32 × 5) ms = 340 ms: 170 ms of prompt
    ],
)
def test_a_ratio_target_scales_the_prompt_share_with_the_decode_rows(
    n_decoding: int, expected: int
) -> None:
    sched = _decoding_scheduler(0.0, n_decoding=n_decoding, itl_target_ratio=2.0)
    sched.add(make_request("long", 500))  # a backlog under 32 × the share
    out = sched.schedule()
    assert [len(c.token_ids) for c in out.chunks[n_decoding:]] == [expected]


def test_with_both_targets_the_larger_applies() -> None:
    sched = _decoding_scheduler(0.150, itl_target_ratio=2.0)  # 150 ms > 2 × 30 ms
    sched.add(make_request("long", 2000))
    assert len(sched.schedule().chunks[4].token_ids) == 120
    sched = _decoding_scheduler(0.040, n_decoding=32, itl_target_ratio=2.0)  # 340 ms > 40
    sched.add(make_request("long", 2000))
    assert len(sched.schedule().chunks[32].token_ids) == 170


def test_with_nothing_decoding_a_prompt_takes_the_whole_budget() -> None:
    sched = Scheduler(
        max_num_seqs=8,
        max_batch_tokens=512,
        kv_capacity=None,
        policy=SchedulingPolicy(itl_target_s=0.050),
    )
    sched.add(make_request("long", 2000))
    assert [len(c.token_ids) for c in sched.schedule().chunks] == [512]


def test_memory_pressure_halves_the_step_budget_and_admissions() -> None:
    sched = Scheduler(max_num_seqs=4, max_batch_tokens=64, kv_capacity=None)
    sched.memory_pressure = True
    for i in range(4):
        sched.add(make_request(f"r{i}", 40))
    out = sched.schedule()
    # half the budget (32 tokens), and at most 2 of the 4 slots
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [("r0", 32)]
    complete(out)
    out = sched.schedule()
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [
        ("r0", 8),
        ("r1", 24),
    ]
    complete(out)
    assert sched.num_running == 2 and sched.num_waiting == 2
    sched.memory_pressure = False
    sched.schedule()
    assert sched.num_running == 4


def test_an_aged_waiting_prompt_waits_the_step_that_ends_a_high_one() -> None:
    sched, _, _ = _aged_low_then_high(admit_low=False)  # "low" waited: it ranks first
    out = sched.schedule()
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [("high", 100)]
    assert out.chunks[-1].sample  # the high request's first token comes from this step
    complete(out)
    out = sched.schedule()  # the aged prompt is admitted in the very next step, with the
    # chunk a prompt gets while high-priority requests keep arriving
    assert [(c.request.request_id, len(c.token_ids)) for c in out.chunks] == [
        ("high", 1),
        ("low", 128),
    ]
