"""Speculative decoding logic: n-gram drafts, the acceptance rule, adaptivity (pure)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferflux.engine.spec_cost import cost_table
from inferflux.engine.speculative import (
    AcceptanceTracker,
    MatchPrior,
    NgramIndex,
    NgramProposer,
    SpecConfig,
    StepCost,
    best_draft_length,
    expected_gain,
    match_prior,
    propose_ngram,
    speculative_sample,
)
from inferflux.scheduler import Request, RequestId

tokens_st = st.lists(st.integers(0, 5), max_size=60)


@given(tokens_st, st.integers(0, 6))
@settings(max_examples=300, deadline=None)
def test_the_incremental_index_proposes_what_the_reference_scan_proposes(tokens, k) -> None:
    index = NgramIndex()
    for i in range(0, len(tokens), 7):  # arrives in pieces, as outputs do
        index.extend(tokens[i : i + 7])
    assert index.propose(k) == propose_ngram(tokens, k)


@given(tokens_st, st.integers(1, 6))
@settings(max_examples=200, deadline=None)
def test_a_draft_continues_an_earlier_occurrence_of_the_suffix(tokens, k) -> None:
    draft = propose_ngram(tokens, k)
    assert len(draft) <= k
    if draft:
        assert len(draft) == k  # a copy that reaches the present goes on as a repeat
        text = tokens + draft  # the copy may run on into the draft itself
        starts = [
            e + 1
            for n in range(2, 5)
            for e in range(n - 1, len(tokens) - 1)
            if text[e - n + 1 : e + 1] == tokens[len(tokens) - n :]
        ]
        assert any(text[s : s + len(draft)] == draft for s in starts)


def test_the_longest_and_most_recent_match_wins() -> None:
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3, 7, 1, 2, 3]
    assert propose_ngram(tokens, 2) == [8, 5]  # (1, 2, 3) last seen before 8
    index = NgramIndex()
    index.extend(tokens)
    assert index.propose(2) == [8, 5]
    assert propose_ngram([4, 5, 6], 3) == []  # nothing repeats


def test_the_occurrence_whose_context_matches_furthest_back_wins() -> None:
    # (1, 2, 3, 4) ends at 5 after (5, 6) and at 11 after (9, 8); the list ends in
    # (5, 6, 1, 2, 3, 4): the older occurrence is the passage being copied
    tokens = [5, 6, 1, 2, 3, 4, 9, 8, 1, 2, 3, 4, 7, 0, 5, 6, 1, 2, 3, 4]
    index = NgramIndex()
    index.extend(tokens)
    assert index.propose_matched(3) == ([9, 8, 1], 6)
    assert propose_ngram(tokens, 3) == [9, 8, 1]
    assert propose_ngram(tokens[6:], 3) == [7, 0, 5]  # one occurrence: the latest


def test_a_copy_that_reaches_the_present_goes_on_as_a_repeat() -> None:
    loop = [7, 1, 2, 3, 1, 2, 3, 1]  # repeating (1, 2, 3): (1, 2, 3, 1) last ended 3 back
    index = NgramIndex()
    index.extend(loop)
    assert index.propose(7) == [2, 3, 1, 2, 3, 1, 2] == propose_ngram(loop, 7)
    assert index.propose_matched(2) == ([2, 3], 4)  # within one round: the plain copy
    # the draft a copy of llama.cpp's ngram-mod chaining would make on the same loop
    assert propose_ngram([5, 6, 5, 6], 5) == [5, 6, 5, 6, 5]


def _law(p: np.ndarray, q: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    counts = np.zeros(len(p))
    for _ in range(n):
        x = int(rng.choice(len(q), p=q))
        counts[speculative_sample(p, q, x, rng.random(), rng.random())] += 1
    return counts / n


def test_speculative_sampling_keeps_the_target_distribution() -> None:
    """Rejection sampling with a stochastic draft q: the emitted token's law is p."""
    rng = np.random.default_rng(7)
    for _ in range(3):
        p = rng.dirichlet(np.ones(6))
        q = rng.dirichlet(np.ones(6))
        law = _law(p, q, 20_000, rng)
        assert np.abs(law - p).max() < 0.015, (law, p)


def test_a_deterministic_draft_is_sampling_the_target_and_comparing() -> None:
    """q one-hot on x: accept with p(x), else p without x. Equals "sample p, keep if it
    is x, else that sample" — what EngineCore does with the request's own sampler."""
    rng = np.random.default_rng(3)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    for x in range(4):
        q = np.eye(4)[x]
        law = _law(p, q, 20_000, rng)
        assert np.abs(law - p).max() < 0.015


def test_acceptance_pauses_under_the_threshold_and_probes_later() -> None:
    tracker = AcceptanceTracker(min_acceptance=0.5, probe_after=10)
    assert tracker.active(0)
    for out in range(1, 6):
        tracker.record(4, 0, out)
    assert tracker.rate < 0.5
    assert not tracker.active(5)
    assert not tracker.active(14)
    assert tracker.active(15)  # probes with a fresh estimate
    assert tracker.rate == tracker.prior
    tracker.record(4, 4, 16)
    assert tracker.active(17)


def test_the_estimate_drifts_back_toward_the_prior() -> None:
    tracker = AcceptanceTracker(min_acceptance=0.0, probe_after=10)
    tracker.record(4, 0, 10)
    low = tracker.estimate(10)
    assert low < tracker.prior
    assert low < tracker.estimate(30) < tracker.prior


def test_the_goodput_gate_drafts_only_when_it_pays() -> None:
    cost = StepCost(second_row=1.0, extra_row=0.4)
    assert cost(1) == 1.0 and cost(2) == 2.0
    k, gain = best_draft_length(1.0, 8, 1, 1.0, cost)
    assert k == 8 and gain == 8.0  # a perfect draft: as long as allowed
    assert best_draft_length(0.6, 8, 1, 1.0, cost)[0] == 0  # not worth a second row
    # free rows (a GPU): any rate is worth it
    assert best_draft_length(0.3, 8, 1, 1.0, StepCost(0.0, 0.0))[0] == 8


def test_a_measured_table_prices_each_row_count_and_its_saw() -> None:
    # Gemma 3 on 2 cores (bench/verify_rows.py): 8 rows cost less than 7 or 9
    costs = {1: 1.0, 2: 1.99, 3: 2.56, 4: 2.96, 5: 4.23, 6: 4.60, 7: 5.30, 8: 3.67}
    costs |= {16: 4.94, 32: 8.87}
    table = cost_table(costs, 36)
    cost = StepCost(table=table)
    assert cost(7) == 5.30 and cost(8) == 3.67  # measured rows as measured
    assert cost(12) == pytest.approx((3.67 + 4.94) / 2, abs=1e-3)  # between 8 and 16
    assert cost(13) == pytest.approx(cost(12) + 4.23 - 2.96, abs=1e-3)  # one leftover row
    assert cost(40) == pytest.approx(cost(36) + (cost(36) - cost(32)))  # past the table
    # the gate sizes a sure draft so that the step's rows are a multiple of 4
    assert best_draft_length(1.0, 9, 1, 1.0, cost)[0] == 7
    assert StepCost(1.0, 0.4)(32) == pytest.approx(2.0 + 0.4 * 30)  # no table: a line


def test_a_draft_whose_later_positions_are_likelier_is_drafted_longer() -> None:
    cost = StepCost(second_row=1.0, extra_row=0.4)
    flat = [0.75] * 16
    rising = [0.75, 0.8, 0.85, 0.9] + [0.99] * 12  # the match grows with each accepted token
    assert expected_gain(flat, 16) == pytest.approx(expected_gain(0.75, 16))
    assert best_draft_length(flat, 16, 1, 1.0, cost)[0] == 0
    k, gain = best_draft_length(rising, 16, 1, 1.0, cost)
    assert k >= 8 and gain == pytest.approx(expected_gain(rising, k))


def _request(rid: str, prompt: list[int], output: list[int] | None = None) -> Request:
    return Request(RequestId(rid), prompt, max_tokens=64, output_token_ids=output or [])


def test_the_proposer_gates_by_batch_opt_out_and_prompt_length() -> None:
    proposer = NgramProposer(SpecConfig(max_batch=3, max_prefill=20, max_draft_tokens=4))
    copy = [1, 2, 3, 4, 5, 6, 7, 8]
    a = _request("a", copy + [1, 2])
    b = _request("b", copy + [1, 2])
    long = _request("long", copy * 3 + [1, 2])
    proposer.config = SpecConfig(
        max_batch=3, max_prefill=20, max_draft_tokens=4, cost=StepCost(0.0, 0.0)
    )
    proposer.register(a, enabled=True)
    proposer.register(b, enabled=False)
    proposer.register(long, enabled=True)
    assert proposer.propose([a, b, long], 100) == {}  # 3 decoding: at max_batch
    assert proposer.propose([a, b], 100) == {RequestId("a"): [3, 4, 5, 6]}
    assert proposer.propose([a], 2) == {RequestId("a"): [3, 4]}  # the budget
    proposer.record(a, 4, 1)
    assert a.num_draft_tokens == 4 and a.num_draft_accepted == 1
    c = proposer.counters
    assert (c.chunks, c.chunks_accepted, c.drafted_tokens, c.accepted_tokens) == (1, 0, 4, 1)
    proposer.forget(RequestId("a"))
    assert proposer.propose([a], 100) == {}


def test_the_proposer_sees_new_output_tokens_and_trusts_long_matches() -> None:
    proposer = NgramProposer(SpecConfig(max_draft_tokens=3))
    r = _request("r", list(range(10, 30)))
    proposer.register(r, enabled=True)
    assert proposer.propose([r], 100) == {}
    r.output_token_ids.extend([11, 12])
    # a 2-token match is chance in free text: not worth a second row on a CPU
    assert proposer.propose([r], 100) == {}
    r.output_token_ids.extend(range(13, 22))
    assert proposer.propose([r], 100) == {RequestId("r"): [22, 23, 24]}  # 11 tokens matched


def test_match_length_is_measured_backwards() -> None:
    index = NgramIndex()
    index.extend([5, 1, 2, 3, 4, 9, 7, 2, 3, 4])
    assert index.propose_matched(2) == ([9, 7], 3)
    assert match_prior(4) == 0.75 and match_prior(16) > 0.93


def test_the_match_prior_learns_each_match_length_from_its_verifications() -> None:
    prior = MatchPrior()
    assert prior.rate(4) == match_prior(4) == 0.75  # before anything was seen
    for _ in range(30):
        prior.record(4, 1, 1)  # 4-token matches are copied here
    assert prior.rate(4) > 0.95 and prior.seen[prior.bucket(4)] == 30
    assert prior.rate(3) == match_prior(3) and prior.rate(5) == match_prior(5)  # untouched
    for _ in range(60):
        prior.record(16, 4, 0)  # 16-token matches fail at once
    assert prior.rate(20) < 0.3  # the same bucket (16..23)


def test_each_position_of_a_draft_is_learned_at_its_own_match_length() -> None:
    prior = MatchPrior()
    prior.record(4, 8, 3)  # positions at matches 4, 5, 6 accepted; the one at 7 missed
    assert [prior.seen[prior.bucket(n)] for n in (4, 5, 6, 8)] == [1, 1, 2, 0]
    assert prior.rate(4) > match_prior(4) and prior.rate(5) > match_prior(5)
    assert prior.rate(6) < match_prior(6)  # bucket 6..7: one hit, one miss
    assert prior.along(30, 4) == [prior.rate(30), prior.rate(31), prior.rate(32), prior.rate(32)]


def test_one_miss_does_not_undo_a_long_run_of_hits() -> None:
    # copying is accepted at 0.97-1.0 a position; the miss that ends a copied stretch
    # must not drop the estimate (and with it the next draft's length) far
    prior = MatchPrior()
    for _ in range(10):
        prior.record(32, 32, 32)
    prior.record(32, 32, 0)
    assert prior.rate(32) > 0.98


def test_a_turned_down_bucket_is_explored_now_and_then() -> None:
    prior = MatchPrior(explore_every=4)
    assert [prior.explore(3) for _ in range(8)] == [False, False, False, True] * 2
    assert not prior.explore(12)  # buckets count apart


def test_a_short_match_is_drafted_once_it_proved_reliable() -> None:
    proposer = NgramProposer(SpecConfig(max_draft_tokens=4))
    proposer.prior = MatchPrior(explore_every=1000)
    r = _request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    proposer.register(r, enabled=True)
    assert proposer.propose([r], 100) == {}  # a 3-token match: 0.67 by the fixed prior
    for _ in range(40):
        proposer.prior.record(3, 1, 1)
    assert proposer.propose([r], 100) == {RequestId("r"): [4, 5, 6, 7]}
    proposer.record(r, 4, 4)
    assert proposer.prior.seen[MatchPrior.bucket(3)] == 41  # it learns from its own drafts


def test_a_request_whose_short_match_drafts_fail_stops_drafting_them() -> None:
    # the worker learned that 3-token matches copy (other requests); this one chats
    proposer = NgramProposer(SpecConfig(max_draft_tokens=4, cost=StepCost(1.0, 0.4)))
    proposer.prior = MatchPrior(explore_every=1000)
    for _ in range(100):
        proposer.prior.record(3, 1, 1)
    chat = _request("chat", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    fresh = _request("fresh", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    proposer.register(chat, enabled=True)
    proposer.register(fresh, enabled=True)
    assert RequestId("chat") in proposer.propose([chat], 100)
    for _ in range(4):
        proposer.record(chat, 4, 0)  # its drafts miss at once
    assert proposer.propose([chat], 100) == {}
    assert RequestId("fresh") in proposer.propose([fresh], 100)  # the worker's rate holds


def test_exploration_drafts_a_few_tokens_of_a_turned_down_match() -> None:
    proposer = NgramProposer(SpecConfig(max_draft_tokens=8))
    proposer.prior = MatchPrior(explore_every=2, explore_tokens=2)
    r = _request("r", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    proposer.register(r, enabled=True)
    assert proposer.propose([r], 100) == {}
    assert proposer.propose([r], 100) == {RequestId("r"): [4, 5]}


def test_a_stall_free_bound_shortens_drafts_to_the_step_cost_it_allows() -> None:
    # rows cost 1 + 1.0 + 0.5 × (n - 2) one-row steps: 3× a one-row step allows 3 drafts
    config = SpecConfig(max_draft_tokens=16, cost=StepCost(1.0, 0.5))
    proposer = NgramProposer(config)
    copy = list(range(10, 40))
    r = _request("r", copy, output=copy[:20])  # a 20-token match: drafted long
    proposer.register(r, enabled=True)
    assert len(proposer.propose([r], 100)[RequestId("r")]) > 3  # the goodput gate's length
    assert proposer.propose([r], 100, max_cost=3.0) == {RequestId("r"): [30, 31, 32]}
    assert proposer.propose([r], 100, max_cost=1.9) == {}  # not even a second row
    assert proposer.propose([r], 100, max_cost=1.0) == {}


def test_a_paused_request_that_copies_again_drafts_before_the_probe() -> None:
    source = list(range(100, 140))
    r = _request("r", [*source, 1, 2])
    proposer = NgramProposer(SpecConfig(max_draft_tokens=4, cost=StepCost(0.0, 0.0)))
    proposer.register(r, enabled=True)
    for _ in range(4):  # four drafts missed at once: under min_acceptance, paused
        proposer.record(r, 4, 0)
    r.output_token_ids = [100, 101, 102]  # a 3-token match may be chance: still paused
    assert proposer.propose([r], 100) == {}
    r.output_token_ids = source[:10]  # 10 tokens copied: the pause ends at once
    assert proposer.propose([r], 100) == {RequestId("r"): [110, 111, 112, 113]}
    proposer.record(r, 4, 4)
    r.output_token_ids = source[:15]
    assert proposer.propose([r], 100) == {RequestId("r"): [115, 116, 117, 118]}  # a probe


def test_a_paused_request_that_does_not_copy_stays_paused() -> None:
    r = _request("r", [*range(100, 140), 1, 2])
    proposer = NgramProposer(SpecConfig(max_draft_tokens=4, cost=StepCost(0.0, 0.0)))
    proposer.register(r, enabled=True)
    for _ in range(4):
        proposer.record(r, 4, 0)
    for n in range(1, 40):  # free text: nothing of the prompt, nothing drafted
        r.output_token_ids = list(range(500, 500 + n))
        assert proposer.propose([r], 100) == {}
