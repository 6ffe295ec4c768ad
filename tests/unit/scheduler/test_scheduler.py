"""Scheduler scenarios with exact state after every step (pure logic, no model)."""

from __future__ import annotations

import random

from inferflux.scheduler import (
    Request,
    RequestId,
    RequestStatus,
    Scheduler,
    SchedulerOutput,
    SeqId,
)
from inferflux.scheduler.request import KvFree


def make_request(rid: str, n_prompt: int, max_tokens: int = 8) -> Request:
    return Request(
        request_id=RequestId(rid),
        prompt_token_ids=list(range(100, 100 + n_prompt)),
        max_tokens=max_tokens,
    )


def summary(out: SchedulerOutput) -> list[tuple[str, int, int, int | None, bool]]:
    """(request, n tokens, start pos, seq id, sample) per chunk."""
    return [
        (c.request.request_id, len(c.token_ids), c.start_pos, c.request.seq_id, c.sample)
        for c in out.chunks
    ]


def complete(out: SchedulerOutput, next_token: int = 7) -> None:
    """What EngineCore does after a step: advance computed counts, append sampled tokens."""
    for chunk in out.chunks:
        chunk.request.num_computed_tokens += len(chunk.token_ids)
        if chunk.sample:
            chunk.request.output_token_ids.append(next_token)


def test_prompts_are_chunked_under_the_token_budget_then_decode_one_token_each() -> None:
    sched = Scheduler(max_num_seqs=4, max_batch_tokens=10, kv_capacity=None)
    a, b = make_request("a", 6), make_request("b", 7)
    sched.add(a)
    sched.add(b)

    out = sched.schedule()
    assert summary(out) == [("a", 6, 0, 0, True), ("b", 4, 0, 1, False)]
    assert out.num_tokens == 10
    complete(out)

    out = sched.schedule()
    # a decodes its sampled token first; b's prompt continues where it stopped
    assert summary(out) == [("a", 1, 6, 0, True), ("b", 3, 4, 1, True)]
    assert out.chunks[0].token_ids == [7]
    assert out.chunks[1].token_ids == [104, 105, 106]
    complete(out)

    out = sched.schedule()
    assert summary(out) == [("a", 1, 7, 0, True), ("b", 1, 7, 1, True)]
    assert sched.num_running == 2 and sched.num_waiting == 0


def test_admission_waits_for_a_free_sequence_slot_and_reuses_the_lowest() -> None:
    sched = Scheduler(max_num_seqs=2, max_batch_tokens=64, kv_capacity=None)
    for rid in "abc":
        sched.add(make_request(rid, 3))
    out = sched.schedule()
    assert summary(out) == [("a", 3, 0, 0, True), ("b", 3, 0, 1, True)]
    assert [r.request_id for r in sched.waiting] == ["c"]
    complete(out)

    finished, ops = sched.finish(RequestId("a"))
    assert ops == [KvFree(SeqId(0))]
    assert finished is not None and finished.seq_id == 0
    assert finished.status == RequestStatus.FINISHED

    out = sched.schedule()
    assert summary(out) == [("b", 1, 3, 1, True), ("c", 3, 0, 0, True)]


def test_finish_of_a_waiting_request_removes_it_from_the_queue() -> None:
    sched = Scheduler(max_num_seqs=1, max_batch_tokens=16, kv_capacity=None)
    sched.add(make_request("a", 2))
    sched.add(make_request("b", 2))
    complete(sched.schedule())
    assert sched.finish(RequestId("b"))[0] is not None
    assert sched.num_waiting == 0
    assert sched.finish(RequestId("b")) == (None, [])
    assert sched.has_work()  # a still runs


def test_unified_kv_reserves_prompt_plus_max_tokens_at_admission() -> None:
    sched = Scheduler(max_num_seqs=4, max_batch_tokens=64, kv_capacity=20)
    sched.add(make_request("a", 5, max_tokens=10))  # 15 cells
    sched.add(make_request("b", 4, max_tokens=4))  # 8 cells: 23 > 20, waits
    out = sched.schedule()
    assert summary(out) == [("a", 5, 0, 0, True)]
    complete(out)
    sched.finish(RequestId("a"))
    out = sched.schedule()
    assert summary(out) == [("b", 4, 0, 0, True)]


def test_a_request_larger_than_the_kv_cache_can_never_fit() -> None:
    sched = Scheduler(max_num_seqs=4, max_batch_tokens=64, kv_capacity=20)
    assert not sched.can_ever_fit(make_request("big", 15, max_tokens=6))
    assert sched.can_ever_fit(make_request("ok", 15, max_tokens=5))


def test_decode_tokens_take_the_budget_before_new_prompts() -> None:
    sched = Scheduler(max_num_seqs=4, max_batch_tokens=4, kv_capacity=None)
    for rid in "abc":
        sched.add(make_request(rid, 1))
    out = sched.schedule()
    assert summary(out) == [("a", 1, 0, 0, True), ("b", 1, 0, 1, True), ("c", 1, 0, 2, True)]
    complete(out)
    sched.add(make_request("d", 5))
    out = sched.schedule()
    # three decode tokens first, then one prompt token of d under the budget of 4
    assert summary(out) == [
        ("a", 1, 1, 0, True),
        ("b", 1, 1, 1, True),
        ("c", 1, 1, 2, True),
        ("d", 1, 0, 3, False),
    ]


def test_duplicate_request_ids_are_refused() -> None:
    sched = Scheduler(max_num_seqs=1, max_batch_tokens=8, kv_capacity=None)
    sched.add(make_request("a", 1))
    try:
        sched.add(make_request("a", 1))
    except ValueError as exc:
        assert "duplicate" in str(exc)
    else:
        raise AssertionError("duplicate id accepted")


def test_a_decoding_request_gets_the_chunk_the_general_path_would_make() -> None:
    """`_decode_rows` builds a decoding request's one-token chunk directly (its latest
    sampled token, sample=True); it must equal `Scheduler._chunk(request, 1)` in every
    state a run passes through: prompts chunked over steps, decodes, finishes, reuse."""
    rng = random.Random(5)
    sched = Scheduler(max_num_seqs=4, max_batch_tokens=12, kv_capacity=None)
    made = 0
    for _ in range(300):
        while sched.num_waiting < 2:
            made += 1
            sched.add(make_request(f"r{made}", rng.randint(1, 20), rng.randint(1, 6)))
        out = sched.schedule()
        for chunk in out.chunks:
            if len(chunk.token_ids) == 1 and chunk.sample:
                assert chunk == Scheduler._chunk(chunk.request, 1)
        complete(out, next_token=rng.randint(0, 50))
        for chunk in out.chunks:
            request = chunk.request
            if len(request.output_token_ids) >= request.max_tokens:
                sched.finish(request.request_id)
    assert made > 50  # requests came and went
