"""Replay InferFlux's speculation policy over saved greedy outputs: what the drafter and
its gates give, priced with measured step costs, without a server's noise.

`bench/spec_bound.py --json F` saves, per workload, every prompt's greedy output and the
measured cost of a 1..K+1-row step. This replays the real `NgramProposer` (drafts,
goodput gate, learned match rates) at concurrency 1 over those outputs: each step
drafts what the proposer proposes, the draft is accepted up to its first token that
differs from the saved output (greedy verification), and the step costs the measured
time of its rows. Like a worker, one proposer serves all of a workload's prompts, and the
workload runs `--passes` times (the rates it learns carry over); the last pass is
reported. Prefill and server overhead are left out: the figures are the decode steps'.
Where the gate drafts nothing though the prompt lookup has a match, the report counts,
per match length, how often that match's first token would have held
(`declined_first_held`: what the gate could not know).

    .venv/bin/python bench/spec_policy.py /tmp/gemma_bound.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from inferflux.engine.speculative import NgramIndex, NgramProposer, SpecConfig, StepCost
from inferflux.scheduler import Request
from spec_bound import ngram_runs, oracle_cost


def step_cost(step_s: dict[int, float]) -> StepCost:
    """The gate's row costs from measured step times: each row count in one-row steps."""
    return StepCost(table=tuple(step_s[r] / step_s[1] for r in sorted(step_s)))


def replay_one(
    proposer: NgramProposer,
    request_id: str,
    prompt: list[int],
    output: list[int],
    max_tokens: int,
    step_s: dict[int, float],
    declined: dict[int, list[int]] | None = None,
) -> dict[str, float]:
    """One request alone: the decode seconds, steps, drafted and accepted tokens of its
    output after the first token (which the prefill step gives). With `declined`, adds
    to it, per match length, [first token held, tries] of the lookups the gate declined."""
    request = Request(request_id, list(prompt), max_tokens)
    proposer.register(request, enabled=True)
    request.output_token_ids = output[:1]
    lookup = NgramIndex()  # the proposer's lookup, outside it: what the gate turned down
    lookup.extend(prompt)
    seconds, steps, drafted, accepted = 0.0, 0, 0, 0
    t, n = 1, len(output)
    top = max(step_s)
    while t < n:
        room = max_tokens - len(request.output_token_ids) - 1  # the last token: none
        draft = proposer.propose([request], budget=4096).get(request_id, [])
        draft = draft[: min(max(room, 0), top - 1)]
        if not draft and declined is not None and room > 0:
            lookup.extend(output[len(lookup.tokens) - len(prompt) : t])
            candidate, length = lookup.propose_matched(1)
            if candidate:
                counts = declined.setdefault(length, [0, 0])
                counts[0] += candidate[0] == output[t]
                counts[1] += 1
        hit = 0
        while hit < len(draft) and t + hit < n and draft[hit] == output[t + hit]:
            hit += 1
        if draft:
            proposer.record(request, len(draft), hit)
        seconds += step_s[1 + len(draft)]
        steps += 1
        drafted += len(draft)
        accepted += hit
        t = min(n, t + hit + 1)
        request.output_token_ids = output[:t]
    proposer.forget(request_id)
    return {"seconds": seconds, "steps": steps, "drafted": drafted, "accepted": accepted}


def replay(saved: dict[str, Any], passes: int, max_tokens: int) -> list[dict[str, Any]]:
    rows = []
    for workload, data in saved["generations"].items():
        step_s = {int(r): s for r, s in data["step_s"].items()}
        one, k_max = step_s[1], max(step_s) - 1
        proposer = NgramProposer(SpecConfig(cost=step_cost(step_s)))
        oracle_s = oracle_steps = 0.0
        for gen in data["outputs"]:
            runs = ngram_runs(gen["prompt"], gen["output"], k_max)[1:]
            cost, steps = oracle_cost(runs, step_s, k_max)
            oracle_s += cost
            oracle_steps += steps
        totals: dict[str, float] = {}
        declined: dict[int, list[int]] = {}
        for _ in range(passes):
            totals = dict.fromkeys(("seconds", "steps", "drafted", "accepted", "off"), 0.0)
            declined = {}
            for i, gen in enumerate(data["outputs"]):
                out = replay_one(
                    proposer, f"r{i}", gen["prompt"], gen["output"], max_tokens, step_s, declined
                )
                for key, value in out.items():
                    totals[key] += value
                totals["off"] += (len(gen["output"]) - 1) * one
        rows.append(
            {
                "workload": workload,
                "decode_off_s": round(totals["off"], 3),
                "decode_policy_s": round(totals["seconds"], 3),
                "decode_speedup": round(totals["off"] / totals["seconds"], 3),
                # the drafter's own bound (bench/spec_bound.py: an oracle picks lengths)
                "decode_oracle_s": round(oracle_s, 3),
                "oracle_speedup": round(totals["off"] / oracle_s, 3),
                "oracle_steps": int(oracle_steps),
                "steps": int(totals["steps"]),
                "drafted": int(totals["drafted"]),
                "accepted": int(totals["accepted"]),
                # match length: [first token held, tries] where the gate drafted nothing
                "declined_first_held": {str(k): declined[k] for k in sorted(declined)},
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("saved", type=Path, help="a bench/spec_bound.py --json report")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=192, help="as the saved run's")
    args = p.parse_args(argv)
    saved = json.loads(args.saved.read_text(encoding="utf-8"))
    for row in replay(saved, args.passes, args.max_tokens):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
