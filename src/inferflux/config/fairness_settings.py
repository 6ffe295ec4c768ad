"""Settings of priority fairness (`scheduler.fairness`): preemption, time slices, and what
a high-priority arrival may stop or shorten. docs/scheduling.md says what each measured."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class FairnessSettings(_Section):
    enable_preemption: bool = Field(
        True,
        description="A waiting request of `high_priority_threshold` or better takes the "
        "slot of the newest running request of a lower priority (its KV goes to the prefix "
        "cache; it resumes later without losing or repeating tokens).",
    )
    high_priority_threshold: Literal["high", "normal", "low"] = Field(
        "high", description="Lowest priority whose waiting requests may preempt."
    )
    max_timeslice_tokens: int = Field(
        128,
        ge=1,
        le=1_000_000,
        description="Tokens a running request generates before it yields its slot to "
        "waiting requests of a higher priority.",
    )
    high_traffic_chunk_tokens: int = Field(
        128,
        ge=0,
        le=1_000_000,
        description="While high-priority requests have arrived in the last 30 s, a step "
        "carries at most this many prompt tokens of other requests: shorter steps lose "
        "less when `interrupt_steps` stops one, and a high-priority arrival that comes "
        "too late in a step to stop it waits less (a full 512-token chunk takes about a "
        "second on 2 CPU cores). High-priority prompts are never capped. 0 = off.",
    )
    interrupt_steps: bool = Field(
        True,
        description="A step of lower-priority requests stops part-way when a "
        "high-priority request arrives, and is planned again with it: the high-priority "
        "prompt does not wait for the rest of that step. Steps carrying prompt tokens are "
        "stoppable always; steps that only decode, while high-priority requests have "
        "arrived in the last 30 s. What the stopped step computed is lost (at most one "
        "step per high-priority arrival).",
    )
    high_prefill_alone: bool = Field(
        True,
        description="The step that gives a high-priority prompt its first token carries "
        "nothing of lower-priority requests, decode rows or prompt chunks (they wait that "
        "one step), so its time is that of the prompt alone. Earlier chunks of a long "
        "high-priority prompt still run beside the streams.",
    )
