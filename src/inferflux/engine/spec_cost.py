"""What verification rows cost on this machine, with this model: measured at worker start
for the goodput gate of speculative decoding (engine/speculative.py `StepCost`).

Owns: one short calibration on a scratch sequence before the worker reports ready:
decode steps of 1 to 8, 16 and 32 logits rows over a 64-token context, each row sampled as
a verified row is (the sampler chain over the whole vocabulary), the fastest of two
passes after a warm-up pass, and from them the cost of every row count up to 36 (`cost_table`).
Does not own the gate's rule. Why measure: the cost of a second row is the whole question
of "never slower", and it differs by model (the LM head is 20% of SmolLM2 135M and 62% of
Gemma 3 270M), quantization, CPU and GPU (near 0 there). A fixed table measured once on
one machine was wrong for every other one; `runtime.speculative_decoding.second_row_cost`
and `extra_row_cost` still override it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from inferflux.engine.backends.base import DecodeChunk, SamplerHandle
from inferflux.engine.speculative import StepCost

logger = logging.getLogger(__name__)

_CONTEXT = 64  # tokens already in the scratch sequence
_REPS = 2
_WIDE = 32  # rows of the widest step measured (about the default max_draft_tokens)
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
    # the widest step the scratch sequence holds (a small per-sequence context: narrower)
    wide = min(_WIDE, getattr(backend, "n_ctx_per_seq", _CONTEXT + _WIDE) - _CONTEXT)
    widths = [n for n in (*range(1, 9), 16, 32) if n <= max(wide, 8)]
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

        # passes over every width (the first a warm-up), so that a burst of other work
        # on the machine spreads over the widths; the fastest of each (noise only adds)
        runs: dict[int, list[float]] = {rows: [] for rows in widths}
        for _ in range(_REPS + 1):
            for rows in widths:
                runs[rows].append(step(rows))
        times = {rows: min(r[1:]) for rows, r in runs.items()}
    finally:
        backend.free_seq(seq_id)
        close = getattr(sampler, "close", None)
        if close is not None:
            close()
    one = times[1]
    costs = {n: min(max(t / one, 1.0), _BOUND * n) for n, t in times.items()}
    table = cost_table(costs, max(widths) + 4)
    cost = StepCost(second_row=table[1] - 1.0, extra_row=(table[7] - table[1]) / 6, table=table)
    logger.info(
        "speculative decoding: a step of 1-8 rows costs %s one-row steps (%.1f ms), of 16 "
        "%.2f, of 32 %.2f, measured",
        " ".join(f"{c:.2f}" for c in table[:8]),
        1000 * one,
        cost(16),
        cost(32),
    )
    return cost


def cost_table(costs: dict[int, float], size: int) -> tuple[float, ...]:
    """The cost of 1..size rows from the measured `costs` (1..8 rows, and some multiples
    of 4 past that). Past 8: the cost of the multiple of 4 below (a line between the
    measured multiples, extended by the last two) plus what the leftover rows added
    over 4 rows (the 5-, 6- and 7-row steps minus the 4-row step). Why: the matrix
    products run 4 rows at a time and leftover rows one by one (StepCost)."""
    quads = sorted(n for n in costs if n % 4 == 0)

    def base(n: int) -> float:
        lo = max((q for q in quads if q <= n), default=quads[0])
        hi = min((q for q in quads if q > lo), default=None)
        if hi is None:  # past the widest measured: the last two's slope
            lo, hi = (quads[-2], quads[-1]) if len(quads) > 1 else (lo, lo)
        slope = (costs[hi] - costs[lo]) / (hi - lo) if hi > lo else 0.0
        return costs[lo] + slope * (n - lo)

    table = []
    for n in range(1, size + 1):
        if n <= 8:
            table.append(costs[n])
            continue
        leftover = n % 4
        extra = costs[4 + leftover] - costs[4] if leftover else 0.0
        table.append(base(n - leftover) + extra)
    return tuple(round(c, 3) for c in table)
