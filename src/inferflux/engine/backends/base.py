"""The contract between EngineCore and a model runtime: `ModelBackend`, `SamplerSpec`.

EngineCore depends on this module only; `llama_cpp.py` implements it. Tests of pure
engine logic could implement it with a fake; anything that claims to generate uses
the real backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# llama.cpp's default order of the samplers between the logit bias and the final draw
# (common/sampling.cpp); a request's `samplers` picks and orders a subset
DEFAULT_SAMPLER_ORDER = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)


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
    constraint: str | None = None  # an llguidance grammar (engine/grammar.py)
    typical_p: float = 1.0
    top_n_sigma: float = -1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    samplers: tuple[str, ...] | None = None  # the order (None: DEFAULT_SAMPLER_ORDER)


class SamplerHandle(Protocol):
    """A backend's per-sequence sampler state. Must be closed when the sequence ends."""

    @property
    def constraint_complete(self) -> bool:
        """True once the sequence's constraint (if any) admits no further token."""
        ...

    def close(self) -> None: ...


class StepInterrupted(Exception):
    """`decode` stopped before the end because the interrupt check said so
    (`set_interrupt`). llama.cpp removed the positions of the batch it was computing; the
    caller trims every chunk's sequence back to where the step began and plans again."""


# One chunk of a step: (seq_id, token_ids, start_pos, n_logits). `n_logits` trailing
# tokens of the chunk get logits: 0 none, 1 the last (to sample), len(token_ids) all
# (prompt logprobs). A bool works too (True = 1).
DecodeChunk = tuple[int, list[int], int, int]

# (logprob of the token, the k most likely (token id, logprob), most likely first)
Logprob = tuple[float, list[tuple[int, float]]]


class ModelBackend(Protocol):
    """One model and one context holding many sequences. Touched by one thread only."""

    eog_token_ids: frozenset[int]
    n_ctx_total: int

    def constraints_ready(self, wait_s: float = 0.0) -> bool:
        """True when `make_sampler` can build a constrained sampler without blocking
        (waits up to `wait_s` for that); False starts whatever preparation that needs
        (on another thread)."""
        ...

    def make_sampler(self, spec: SamplerSpec) -> SamplerHandle: ...

    def sample(self, sampler: SamplerHandle, batch_index: int) -> int:
        """Sample from batch row `batch_index` of the latest decode; records the token
        in the sampler's penalty history."""
        ...

    def decode(self, chunks: list[DecodeChunk]) -> list[int]:
        """One forward pass over every chunk; returns per chunk the row of its last
        token's logits (-1 where n_logits is 0); the chunk's other logits rows precede it.
        Raises EngineError on failure, StepInterrupted when the armed check stopped it."""
        ...

    def set_interrupt(self, check: Callable[[], bool] | None) -> None:
        """Arm (`check`) or disarm (None) interruption of the decodes that follow: `check`
        is called now and then during a decode, and True stops it (StepInterrupted).
        A backend that cannot stop a decode ignores it."""
        ...

    def logprobs(self, row: int, token_ids: list[int], top_k: int) -> list[Logprob]:
        """Log-probabilities under the raw distribution of batch row `row`, one entry per
        token of `token_ids`, each with the `top_k` most likely tokens."""
        ...

    def copy_seq(self, src: int, dst: int, n_tokens: int) -> bool:
        """Make `dst` hold the first `n_tokens` positions of `src`'s KV (dst is cleared
        first). False when the backend could not (dst is then empty)."""
        ...

    def trim_seq(self, seq_id: int, n_tokens: int) -> bool:
        """Keep only the first `n_tokens` positions of `seq_id`. False when llama.cpp
        refused (the sequence is then cleared)."""
        ...

    def keep_seq(self, seq_id: int, n_tokens: int) -> bool:
        """Keep the first `n_tokens` positions of `seq_id` for a request that continues
        them in place. False (the sequence is then cleared) when they cannot serve: a
        sliding-window cache may lack positions the next token attends to."""
        ...

    def save_seq(self, seq_id: int) -> bytes | memoryview:
        """The KV of `seq_id` as state bytes (what `load_seq` takes)."""
        ...

    def load_seq(self, seq_id: int, data: bytes | bytearray | memoryview, n_tokens: int) -> bool:
        """`seq_id` := the state in `data`, cut to its first `n_tokens` positions. False
        (the sequence is then empty) when refused or holding fewer positions."""
        ...

    def free_seq(self, seq_id: int) -> None: ...

    def piece(self, token: int) -> bytes: ...

    def close(self) -> None: ...
