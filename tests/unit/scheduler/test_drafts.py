"""Drafts in the scheduler's token budget and KV reservation (pure logic)."""

from __future__ import annotations

from inferflux.scheduler import Request, RequestId, Scheduler
from inferflux.scheduler.policy import SchedulingPolicy


class FakeProposer:
    """Drafts `draft` for every request offered (records what it was offered)."""

    def __init__(self, draft: list[int]) -> None:
        self.draft = draft
        self.offered: list[tuple[list[str], int]] = []
        self.max_costs: list[float] = []

    def propose(
        self, requests: list[Request], budget: int, max_cost: float = 0.0
    ) -> dict[RequestId, list[int]]:
        self.offered.append(([r.request_id for r in requests], budget))
        self.max_costs.append(max_cost)
        return {r.request_id: self.draft[:budget] for r in requests}


def make_request(rid: str, n_prompt: int, max_tokens: int = 8) -> Request:
    return Request(RequestId(rid), list(range(100, 100 + n_prompt)), max_tokens=max_tokens)


def decode_one(scheduler: Scheduler, token: int = 7) -> list[tuple[str, int, tuple[int, ...]]]:
    out = scheduler.schedule()
    for chunk in out.chunks:
        chunk.request.num_computed_tokens += len(chunk.token_ids)
        if chunk.sample:
            chunk.request.output_token_ids.append(token)
    return [(c.request.request_id, len(c.token_ids), c.draft_token_ids) for c in out.chunks]


def test_drafts_ride_on_decoding_chunks_only_and_count_in_the_budget() -> None:
    scheduler = Scheduler(max_num_seqs=4, max_batch_tokens=12, kv_capacity=None)
    proposer = FakeProposer([1, 2, 3, 4, 5])
    scheduler.draft_proposer = proposer
    scheduler.add(make_request("a", 4, max_tokens=20))
    assert decode_one(scheduler) == [("a", 4, ())]  # prefill: no draft
    scheduler.add(make_request("b", 10, max_tokens=20))
    # a decodes (1 row), b prefills 10 of its tokens; 1 row left for a draft
    assert decode_one(scheduler) == [("a", 1, (1,)), ("b", 10, ())]
    assert proposer.offered[-1] == (["a"], 1)
    out = scheduler.schedule()
    assert out.num_tokens == 12  # 2 decoding rows, then 10 draft rows (5 each)
    assert [c.draft_token_ids for c in out.chunks] == [(1, 2, 3, 4, 5), (1, 2, 3, 4, 5)]


def test_a_draft_never_outruns_max_tokens() -> None:
    scheduler = Scheduler(max_num_seqs=2, max_batch_tokens=64, kv_capacity=100)
    scheduler.draft_proposer = FakeProposer([1, 2, 3, 4, 5, 6, 7, 8])
    scheduler.add(make_request("a", 4, max_tokens=4))
    decode_one(scheduler)  # prefill; 1 token out
    # 3 tokens left: a draft of 2 plus the one sampled after it
    assert decode_one(scheduler) == [("a", 1, (1, 2))]
    assert decode_one(scheduler) == [("a", 1, (1,))]
    assert decode_one(scheduler) == [("a", 1, ())]  # the last token: nothing to draft


def test_without_a_proposer_nothing_is_drafted() -> None:
    scheduler = Scheduler(max_num_seqs=2, max_batch_tokens=64, kv_capacity=None)
    scheduler.add(make_request("a", 4))
    decode_one(scheduler)
    assert decode_one(scheduler) == [("a", 1, ())]


def _targeted(proposer: FakeProposer) -> Scheduler:
    """A scheduler under a stall-free target (3× the decode rows) drafting with `proposer`."""
    scheduler = Scheduler(
        max_num_seqs=2,
        max_batch_tokens=64,
        kv_capacity=None,
        policy=SchedulingPolicy(itl_target_ratio=3.0),
    )
    scheduler.draft_proposer = proposer
    return scheduler


def test_a_stall_free_target_bounds_the_drafts_step_by_its_decode_rows() -> None:
    proposer = FakeProposer([1, 2, 3])
    scheduler = _targeted(proposer)
    scheduler.add(make_request("a", 4, max_tokens=40))
    decode_one(scheduler)  # prefill: nothing decodes, no bound
    decode_one(scheduler)
    assert proposer.max_costs[-1] == 3.0  # decode rows only: the ratio itself
    scheduler.add(make_request("b", 10, max_tokens=40))
    decode_one(scheduler)  # b's prompt rides in this step: no drafts beside it
    assert proposer.max_costs[-1] == 1.0
    scheduler.policy = SchedulingPolicy()
    decode_one(scheduler)
    assert proposer.max_costs[-1] == 0.0  # no target: the goodput gate alone


def test_a_collected_requests_drafts_are_not_bounded_by_the_target() -> None:
    proposer = FakeProposer([1, 2, 3])
    scheduler = _targeted(proposer)
    collected = make_request("a", 4, max_tokens=40)
    collected.streamed = False  # stream: false: its tokens wait for its end anyway
    scheduler.add(collected)
    decode_one(scheduler)
    decode_one(scheduler)
    assert proposer.max_costs[-1] == 0.0  # the goodput gate alone
