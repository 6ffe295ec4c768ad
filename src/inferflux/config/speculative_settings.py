"""The `runtime.speculative_decoding` settings section (docs/speculative.md)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpeculativeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        True,
        description="Speculative decoding: draft tokens are verified by the model inside "
        "the continuous batch; greedy and seeded outputs stay the same. Adaptive: off for "
        "a request whose acceptance falls under min_acceptance, and for steps with "
        "max_batch or more decoding sequences (docs/speculative.md).",
    )
    mode: Literal["ngram", "draft"] = Field(
        "ngram",
        description="Where drafts come from: `ngram` = prompt lookup (the request's own "
        "prompt and output; no second model); `draft` = draft_model, run greedily in a "
        "context of its own beside the model.",
    )
    draft_model: str | None = Field(
        None,
        description="Path of the draft GGUF for mode `draft`; its vocabulary must be the "
        "model's (checked at load).",
    )

    @model_validator(mode="after")
    def _draft_needs_a_model(self) -> Self:
        if self.mode == "draft" and not self.draft_model:
            raise ValueError(
                "mode 'draft' needs a draft model: set runtime.speculative_decoding."
                "draft_model (INFERFLUX_SPEC_DRAFT_MODEL)"
            )
        return self

    max_draft_tokens: int = Field(
        32,
        ge=1,
        le=64,
        description="Longest draft verified in one step (tokens); each draft is as long as "
        "its expected accepted tokens per unit of step cost make worthwhile.",
    )
    max_prefill: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Requests whose prompt is longer than this many tokens never "
        "speculate. 0 = no limit.",
    )
    min_acceptance: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="A request whose rolling draft acceptance falls under this stops "
        "speculating, and probes again after probe_after generated tokens.",
    )
    probe_after: int = Field(
        64, ge=1, le=1_000_000, description="Generated tokens before a paused request probes."
    )
    second_row_cost: float | None = Field(
        None,
        ge=0.0,
        le=100.0,
        description="Cost model of the goodput gate: what a second logits row adds to a "
        "one-row decode step, in one-row steps. Unset: measured by each worker at start "
        "for its model and machine (docs/speculative.md; 2 CPU cores: about 1.0, a GPU: "
        "about 0). Set it (and extra_row_cost) to skip the measurement.",
    )
    extra_row_cost: float | None = Field(
        None,
        ge=0.0,
        le=100.0,
        description="Cost model of the goodput gate: what each further row adds, in "
        "one-row steps. Unset: measured at start (2 CPU cores: about 0.4, a GPU: about 0).",
    )
    cost_record: str = Field(
        "~/.cache/inferflux/step-cost.json",
        max_length=4096,
        description="Where workers keep the measured step times of the goodput gate, by "
        "model file, threads, GPU layers, llama.cpp build and CPU: each width's fastest "
        "over the first 3 starts; later starts read it instead of measuring (2-5 s each, "
        "and one start's measurement is noisy on a busy machine). Delete the file to "
        "measure again. Empty: measure at every start, record nothing.",
    )
    max_batch: int = Field(
        4,
        ge=1,
        le=256,
        description="No speculation in a step where this many sequences (or more) decode "
        "together: verification rows then cost more than they save (measured: "
        "docs/speculative.md).",
    )
