"""bench/spec_policy.py: the speculation policy replayed over a saved greedy output."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from inferflux.engine.speculative import NgramProposer, SpecConfig

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
spec_policy = importlib.import_module("spec_policy")

STEP_S = {rows: 0.01 * (1 + 0.25 * (rows - 1)) for rows in range(1, 34)}  # cheap rows


def _proposer() -> NgramProposer:
    return NgramProposer(SpecConfig(cost=spec_policy.step_cost(STEP_S)))


def test_a_copied_output_is_replayed_in_fewer_steps_than_tokens() -> None:
    source = list(range(100, 160))
    prompt = [1, 2, 3, *source, 4, 5]
    output = source[:50]  # the answer copies the source
    out = spec_policy.replay_one(_proposer(), "r", prompt, output, 64, STEP_S)
    assert out["accepted"] > 30  # most of the copy came from drafts
    # every token after the first from a step or a draft (the last step's draft may also
    # cover the end of the output, where the step samples the end-of-generation token)
    assert len(output) - 1 <= out["steps"] + out["accepted"] <= len(output)
    assert out["seconds"] < (len(output) - 1) * STEP_S[1]


def test_an_output_with_nothing_to_copy_costs_what_speculation_off_costs() -> None:
    out = spec_policy.replay_one(_proposer(), "r", [1, 2, 3], list(range(200, 240)), 64, STEP_S)
    assert out["drafted"] == 0 and out["steps"] == 39
    assert abs(out["seconds"] - 39 * STEP_S[1]) < 1e-9


def test_replay_reports_the_policy_beside_the_oracle() -> None:
    source = list(range(100, 160))
    saved = {
        "generations": {
            "edit": {
                "step_s": {str(r): s for r, s in STEP_S.items()},
                "outputs": [{"prompt": [1, *source], "output": [*source[:20], 7, *source[21:40]]}],
            }
        }
    }
    (row,) = spec_policy.replay(saved, passes=2, max_tokens=64)
    assert row["workload"] == "edit"
    assert 1.0 < row["decode_speedup"] <= row["oracle_speedup"]  # no policy beats the oracle


def test_a_declined_lookup_is_counted_with_whether_its_first_token_held() -> None:
    prompt = [1, 2, 4, 9, 1, 2, 3]  # "1 2" is followed by 4, then (the latest) by 3
    output = [1, 2, 3, 8]  # after "1 2" the output goes on with 3: that lookup held
    declined: dict[int, list[int]] = {}
    never = NgramProposer(SpecConfig(cost=spec_policy.step_cost(STEP_S), max_batch=0))
    out = spec_policy.replay_one(never, "r", prompt, output, 64, STEP_S, declined)
    assert out["drafted"] == 0  # max_batch 0: the gate drafts nothing, ever
    # the lookups it turned down, by match length: [first token held, tries]
    assert sum(c[0] for c in declined.values()) == 1  # "1 2" -> 3
    assert sum(c[1] for c in declined.values()) == 2  # and "1 2 3" -> 1, not 8


def test_the_copy_bound_counts_a_copy_that_runs_on_into_a_repeat() -> None:
    spec_bound = importlib.import_module("spec_bound")
    prompt = [9, 1, 2, 3]
    output = [1, 2, 3, 1, 2, 3, 1, 2, 7]  # (1, 2, 3) repeated: a copy from 3 tokens back
    runs = spec_bound.copy_runs(prompt, output, 32)
    assert runs[0] == 8  # from the prompt's (1, 2, 3) on through the output's repeat
    assert runs[3] == 5 and runs[8] == 0
    # what the drafter proposes at each position gets as far as the repeat goes
    assert spec_bound.ngram_runs(prompt, output, 32)[4] == 4
