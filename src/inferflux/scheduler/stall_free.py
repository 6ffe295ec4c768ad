"""Stall-free steps: how many prompt tokens and how much drafting a step may carry.

Owns: the step's stall-free target (`itl_target_s` / `itl_target_ratio`, only while a
streamed sequence decodes), the prompt share that keeps a step's expected time under it,
the bound it puts on a step's drafts, and `PromptAllowance`, the per-step ledger the
scheduler's prompt chunks draw from. Pure logic: the expected times come from
`StepCostModel` (step_cost.py); scheduler.py's docstring says how the pieces combine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.request import PriorityClass, Request, ScheduledChunk
from inferflux.scheduler.step_cost import StepCostModel

# Under an ITL target, prompts still progress by at least this many tokens a step.
MIN_PROMPT_CHUNK = 16
# Under an ITL target a step still carries 1/DRAIN_STEPS of the prompt backlog. A cap
# below the rate prompts arrive at grows the queue until fewer sequences decode (SmolLM2,
# 32 streams of 220-token prompts and 128-token answers: prompts are half the work, and a
# 2× ratio alone gave TTFT p50 18.6 s against 2.2 s uncapped, at 0.73× the tok/s). 8 steps
# drained too fast (ITL p99 282 ms at 8 streams), 32 kept it at 121 ms (engine, measured).
DRAIN_STEPS = 32


@dataclass(slots=True)
class PromptAllowance:
    """The prompt tokens one step may still carry: all of the remaining budget for a
    HIGH-class prompt; in a step that ends a HIGH prompt (`alone`), none for any other;
    while `high_first`, none for a prompt below the HIGH class (`rank`, aging included)
    and `MIN_PROMPT_CHUNK` for one aged to it; else up to `share` in all."""

    budget: int
    share: int
    high_first: bool = False  # a HIGH prompt is prefilling or about to be admitted
    alone: bool = False  # the step ends a HIGH prompt: lower classes stand aside
    taken: int = 0

    def limit(self, request: Request, rank: int) -> int:
        if request.priority == PriorityClass.HIGH:
            return max(0, self.budget - self.taken)
        if self.alone:
            return 0
        if self.high_first:  # aged to HIGH: it keeps progressing, but in small chunks
            small = min(self.budget - self.taken, MIN_PROMPT_CHUNK)
            return 0 if rank > PriorityClass.HIGH else max(0, small)
        return max(0, min(self.budget, self.share) - self.taken)

    def take(self, n: int) -> None:
        self.taken += n


def step_target_s(
    policy: SchedulingPolicy, step_cost: StepCostModel, rows: list[ScheduledChunk]
) -> float:
    """The stall-free target of a step whose decode rows are `rows` (0 = none): the
    larger of `itl_target_s` and `itl_target_ratio` × the rows' expected time, when one
    of them is streamed; a collected request (`stream: false`) reads nothing before its
    end, so a step of those alone takes the whole budget."""
    if policy.itl_target_s <= 0 and policy.itl_target_ratio <= 0:
        return 0.0
    if not any(chunk.request.streamed for chunk in rows):
        return 0.0
    target_s = policy.itl_target_s
    if policy.itl_target_ratio > 0:
        decode_s = step_cost.predict_s(len(rows), 0)
        target_s = max(target_s, policy.itl_target_ratio * decode_s)
    return target_s


def prompt_share(
    step_cost: StepCostModel,
    max_batch_tokens: int,
    target_s: float,
    decoding: int,
    backlog: Callable[[], int],
) -> int:
    """Prompt tokens a step may carry: under a target (`step_target_s`) with sequences
    decoding, what keeps its expected time under the target, but at least
    `MIN_PROMPT_CHUNK` and at least `1 / DRAIN_STEPS` of the prompt `backlog` (computed
    only then); else the whole budget."""
    if target_s <= 0 or decoding == 0:
        return max_batch_tokens
    budget = step_cost.prompt_budget(decoding, target_s)
    if budget < max_batch_tokens:
        budget = max(budget, -(-backlog() // DRAIN_STEPS))
    return min(max_batch_tokens, max(MIN_PROMPT_CHUNK, budget))


def draft_cost_bound(step_cost: StepCostModel, target_s: float, decoding: int, taken: int) -> float:
    """Under a stall-free target, how many times the cost of its decode rows alone a
    step may reach with its drafts (1: none, when `taken` prompt tokens already use the
    step's time); else 0 (no bound). A verification step makes the streams' next token
    wait just as a prompt chunk does: at c = 1 a 12-token draft of SmolLM2 takes about
    7 one-row steps, the stream's ITL p99."""
    if target_s <= 0 or decoding == 0:
        return 0.0  # no target: nothing more to compute on this path (every step)
    decode_s = step_cost.predict_s(decoding, 0)
    if decode_s <= 0:
        return 0.0
    if taken:
        return 1.0
    return max(1.0, target_s / decode_s)
