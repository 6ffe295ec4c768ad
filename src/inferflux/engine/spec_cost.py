"""What verification rows cost on this machine, with this model: measured at worker start
for the goodput gate of speculative decoding (engine/speculative.py `StepCost`).

Owns: one short calibration on a scratch sequence before the worker reports ready:
decode steps of 1, 2, 8 and 32 logits rows over a 64-token context, each row sampled as a
verified row is (the sampler chain over the whole vocabulary), the median of a few runs.
Does not own the gate's rule. Why measure: the cost of a second row is the whole question
of "never slower", and it differs by model (the LM head is 20% of SmolLM2 135M and 62% of
Gemma 3 270M), quantization, CPU and GPU (near 0 there). A fixed table measured once on
one machine was wrong for every other one; `runtime.speculative_decoding.second_row_cost`
and `extra_row_cost` still override it.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Protocol

from inferflux.engine.backends.base import DecodeChunk, SamplerHandle
from inferflux.engine.speculative import TAIL_FROM, StepCost

logger = logging.getLogger(__name__)

_CONTEXT = 64  # tokens already in the scratch sequence
_REPS = 5
_WIDE = 32  # rows of the widest step measured (the default max_draft_tokens, plus one)
_BOUND = 10.0  # costs are clamped to [0, _BOUND] one-row steps


class CalibrationBackend(Protocol):
    @property
    def n_vocab(self) -> int: ...

    def decode(self, chunks: list[DecodeChunk]) -> list[int]: ...

    def sample(self, sampler: SamplerHandle, batch_index: int) -> int: ...

    def trim_seq(self, seq_id: int, n_tokens: int) -> bool: ...

    def free_seq(self, seq_id: int) -> None: ...


def measure_step_cost(
    backend: CalibrationBackend, seq_id: int, make_sampler: Callable[[], SamplerHandle]
) -> StepCost:
    """The StepCost of `backend` measured on `seq_id` (empty before and after)."""
    vocab = backend.n_vocab
    # the widest step the scratch sequence holds (a small per-sequence context: none)
    wide = min(_WIDE, getattr(backend, "n_ctx_per_seq", _CONTEXT + _WIDE) - _CONTEXT)
    widths = (1, 2, TAIL_FROM, wide) if wide > TAIL_FROM else (1, 2, TAIL_FROM)
    tokens = [(i * 7919) % (vocab - 1) + 1 for i in range(_CONTEXT + max(widths))]
    sampler = make_sampler()
    backend.free_seq(seq_id)
    try:
        backend.decode([(seq_id, tokens[:_CONTEXT], 0, 0)])

        def step(rows: int) -> float:
            started = time.perf_counter()
            last = backend.decode([(seq_id, tokens[_CONTEXT : _CONTEXT + rows], _CONTEXT, rows)])
            for row in range(last[0] - rows + 1, last[0] + 1):
                backend.sample(sampler, row)
            elapsed = time.perf_counter() - started
            backend.trim_seq(seq_id, _CONTEXT)
            return elapsed

        times = {}
        for rows in widths:
            step(rows)  # warm-up
            times[rows] = statistics.median(step(rows) for _ in range(_REPS))
    finally:
        backend.free_seq(seq_id)
        close = getattr(sampler, "close", None)
        if close is not None:
            close()
    one = times[1]
    second = min(max(times[2] / one - 1.0, 0.0), _BOUND)
    extra = min(max((times[TAIL_FROM] - times[2]) / ((TAIL_FROM - 2) * one), 0.0), _BOUND)
    tail = extra
    if wide > TAIL_FROM:
        tail = (times[wide] - times[TAIL_FROM]) / ((wide - TAIL_FROM) * one)
        tail = min(max(tail, 0.0), _BOUND)
    logger.info(
        "speculative decoding: a verification row costs %.2f (the second), %.2f (each "
        "after, to %d rows) and %.2f (each after that) of a one-row step (%.1f ms), measured",
        second,
        extra,
        TAIL_FROM,
        tail,
        1000 * one,
    )
    return StepCost(second_row=second, extra_row=extra, tail_row=tail)
