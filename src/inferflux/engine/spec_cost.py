"""What verification rows cost on this machine, with this model: measured at worker start
for the goodput gate of speculative decoding (engine/speculative.py `StepCost`).

Owns: one short calibration on a scratch sequence before the worker reports ready:
decode steps of 1 to 8, 16 and 32 logits rows over a 64-token context, each row sampled as
a verified row is (the sampler chain over the whole vocabulary), the fastest of two
passes after a warm-up pass (the one-row step, every cost's denominator, beside each
width), and from them the cost of every row count up to 36 (`cost_table`);
and the record of those step times across starts (`calibrated_step_cost`, a small JSON
file keyed by model, threads, llama.cpp build and CPU).
Does not own the gate's rule. Why measure: the cost of a second row is the whole question
of "never slower", and it differs by model (the LM head is 20% of SmolLM2 135M and 62% of
Gemma 3 270M), quantization, CPU and GPU (near 0 there). A fixed table measured once on
one machine was wrong for every other one; `runtime.speculative_decoding.second_row_cost`
and `extra_row_cost` still override it.
Why keep a record: one start's two passes are at the mercy of whatever else the machine
does (SmolLM2 on the 2-core VM, ten starts: a one-row step 11.8 to 21.4 ms, a 16-row
step 7.3 to 19.9 one-row steps), and the gate drafts whatever length the table prices
too low. Each width keeps its fastest time over `SETTLED_STARTS` starts (noise only
adds); from then on a start reads the record instead of measuring, which also takes
2-5 s off every worker start, hot reload and scale-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from inferflux.engine.backends.base import DecodeChunk, SamplerHandle
from inferflux.engine.kv_setup import model_identity
from inferflux.engine.speculative import StepCost

if TYPE_CHECKING:
    from inferflux.engine.backends.llama_cpp import ContextConfig

logger = logging.getLogger(__name__)

_CONTEXT = 64  # tokens already in the scratch sequence
_REPS = 2
_WIDE = 32  # rows of the widest step measured (about the default max_draft_tokens)
_BOUND = 10.0  # costs are clamped to [0, _BOUND] one-row steps
SETTLED_STARTS = 3  # starts whose measurements a record merges before it is trusted
_MAX_ENTRIES = 64  # records kept in one file (the least recently written go)


class CalibrationBackend(Protocol):
    @property
    def n_vocab(self) -> int: ...

    def decode(self, chunks: list[DecodeChunk]) -> list[int]: ...

    def sample(self, sampler: SamplerHandle, batch_index: int) -> int: ...

    def trim_seq(self, seq_id: int, n_tokens: int) -> bool: ...

    def free_seq(self, seq_id: int) -> None: ...


def calibrated_step_cost(
    backend: CalibrationBackend,
    seq_id: int,
    make_sampler: Callable[[], SamplerHandle],
    record: Path | None,
    key: str,
) -> StepCost:
    """The StepCost of `backend`: from the `record` file's entry `key` once it merged
    `SETTLED_STARTS` measurements of the same widths, else measured now (on `seq_id`,
    empty before and after) and merged into the entry. `record` None: measured, no file."""
    widths = _widths(backend)
    entry = _read(record, key) if record is not None else None
    if entry is not None and sorted(entry[0]) != widths:
        entry = None  # another context size: other widths
    if entry is not None and entry[1] >= SETTLED_STARTS:
        cost = step_cost_of(entry[0])
        _log(cost, entry[0][1], f"the fastest of {entry[1]} starts, recorded in {record}")
        return cost
    times = measure_step_times(backend, seq_id, make_sampler, widths)
    starts = 1
    if entry is not None:
        times = {n: min(t, entry[0][n]) for n, t in times.items()}
        starts = entry[1] + 1
    if record is not None:
        _write(record, key, times, starts)
    cost = step_cost_of(times)
    _log(cost, times[1], f"measured (the fastest of {starts} starts)")
    return cost


def _widths(backend: CalibrationBackend) -> list[int]:
    """The row counts measured: 1-8, 16 and 32, no wider than the scratch sequence holds
    (a small per-sequence context: narrower)."""
    wide = min(_WIDE, getattr(backend, "n_ctx_per_seq", _CONTEXT + _WIDE) - _CONTEXT)
    return [n for n in (*range(1, 9), 16, 32) if n <= max(wide, 8)]


def measure_step_times(
    backend: CalibrationBackend,
    seq_id: int,
    make_sampler: Callable[[], SamplerHandle],
    widths: list[int],
) -> dict[int, float]:
    """Seconds of a decode step of each of `widths` rows (sampled), the fastest of
    `_REPS` passes after a warm-up pass."""
    vocab = backend.n_vocab
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
        # on the machine spreads over the widths; the fastest of each (noise only adds).
        # The one-row step is every cost's denominator, so it runs beside each width: one
        # slow sample of it alone priced a second row at nothing (a CI run: 2 rows <= 1)
        runs: dict[int, list[float]] = {rows: [] for rows in widths}
        for rep in range(_REPS + 1):
            for rows in widths:
                timed = {1: step(1)}
                if rows != 1:
                    timed[rows] = step(rows)
                if rep:  # the first pass warms up
                    for n, seconds in timed.items():
                        runs[n].append(seconds)
        return {rows: min(r) for rows, r in runs.items()}
    finally:
        backend.free_seq(seq_id)
        close = getattr(sampler, "close", None)
        if close is not None:
            close()


def step_cost_of(times: dict[int, float]) -> StepCost:
    """The StepCost of measured step `times` (seconds by row count, 1 among them)."""
    one = times[1]
    costs = {n: min(max(t / one, 1.0), _BOUND * n) for n, t in times.items()}
    table = cost_table(costs, max(times) + 4)
    return StepCost(second_row=table[1] - 1.0, extra_row=(table[7] - table[1]) / 6, table=table)


def _log(cost: StepCost, one_s: float, how: str) -> None:
    logger.info(
        "speculative decoding: a step of 1-8 rows costs %s one-row steps (%.1f ms), of 16 "
        "%.2f, of 32 %.2f, %s",
        " ".join(f"{c:.2f}" for c in cost.table[:8]),
        1000 * one_s,
        cost(16),
        cost(32),
        how,
    )


def record_key(context: ContextConfig) -> str:
    """The record entry of `context`'s calibration: a digest of what its step times
    depend on: the model and its adapters (`model_identity` without a digest folder: the
    files' paths, sizes and mtimes), threads, GPU layers, KV mode, the llama.cpp build
    and its view of the machine (CPU features, backends), the CPU model and the CPUs this
    process may use."""
    import llama_cpp
    import llama_cpp.llama_cpp as ll

    cpu = ""
    with contextlib.suppress(OSError):
        names = (line for line in Path("/proc/cpuinfo").read_text().splitlines())
        cpu = next(
            (line.split(":", 1)[1].strip() for line in names if line.startswith("model name")), ""
        )
    parts = [
        model_identity(context.model_path, "", context.lora, None),
        context.n_threads,
        context.n_threads_batch,
        context.n_gpu_layers,
        context.kv_unified,
        llama_cpp.__version__,
        ll.llama_print_system_info().decode(errors="replace"),
        cpu,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _read(record: Path, key: str) -> tuple[dict[int, float], int] | None:
    """The entry `key` of `record`: (seconds by width, starts merged); None when absent
    or unreadable (the calibration then measures, and rewrites the file)."""
    try:
        entry = json.loads(record.read_text())["entries"][key]
        times = {int(n): float(t) for n, t in entry["seconds"].items()}
        starts = int(entry["starts"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if 1 not in times or any(t <= 0 for t in times.values()):
        return None
    return times, starts


def _write(record: Path, key: str, times: dict[int, float], starts: int) -> None:
    """Store `key`'s entry in `record` (atomically; a failure is logged, not raised: the
    next start measures again)."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        entries: dict[str, dict[str, object]] = {}
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            loaded = json.loads(record.read_text())["entries"]
            entries = {k: v for k, v in loaded.items() if isinstance(v, dict)}
        entries.pop(key, None)
        entries[key] = {
            "seconds": {str(n): t for n, t in sorted(times.items())},
            "starts": starts,
        }
        kept = dict(list(entries.items())[-_MAX_ENTRIES:])  # insertion order: oldest first
        temp = record.with_name(f"{record.name}.tmp-{os.getpid()}")
        temp.write_text(json.dumps({"version": 1, "entries": kept}, indent=1))
        os.replace(temp, record)
    except OSError as e:
        logger.warning("speculative decoding: could not record the step costs in %s: %s", record, e)


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
