"""The contract between EngineCore and a model runtime: `ModelBackend`, `SamplerSpec`.

EngineCore depends on this module only; `llama_cpp.py` implements it. Tests of pure
engine logic could implement it with a fake; anything that claims to generate uses
the real backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SamplerSpec:
    """How one sequence samples, with the seed already chosen."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    penalty_last_n: int
    logit_bias: tuple[tuple[int, float], ...]
    ignore_eos: bool


class SamplerHandle(Protocol):
    """A backend's per-sequence sampler state. Must be closed when the sequence ends."""

    def close(self) -> None: ...


# One chunk of a step: (seq_id, token_ids, start_pos, want_logits).
DecodeChunk = tuple[int, list[int], int, bool]


class ModelBackend(Protocol):
    """One model and one context holding many sequences. Touched by one thread only."""

    eog_token_ids: frozenset[int]
    n_ctx_total: int

    def make_sampler(self, spec: SamplerSpec) -> SamplerHandle: ...

    def sample(self, sampler: SamplerHandle, batch_index: int) -> int:
        """Sample from batch row `batch_index` of the latest decode; records the token
        in the sampler's penalty history."""
        ...

    def decode(self, chunks: list[DecodeChunk]) -> list[int]:
        """One forward pass over every chunk; returns per chunk the row to sample from
        (-1 where want_logits is False). Raises EngineError on failure."""
        ...

    def free_seq(self, seq_id: int) -> None: ...

    def piece(self, token: int) -> bytes: ...

    def close(self) -> None: ...
