"""What a prefix-cache hit's KV copy costs: the next step's time with and without one.

A prefix-cache hit copies the cached sequence's KV into the request's sequence
(`LlamaCppBackend.copy_seq`), and a finished request's KV is copied into the cache the
same way. With per-sequence KV (`runtime.kv_unified` false, the default) a copy between
two sequences is a copy of the whole sequence's buffer, `n_ctx_per_seq` cells, whatever
the prefix's length. llama.cpp defers it to the next `llama_decode`, so the copy call
itself returns at once. With one shared buffer (`kv_unified` true) a copy only tags
cells.

This times a step of `--suffix` prompt tokens right after a copy of a `--prefix`-token
prefix, alternated with the same step with no copy before it, for both KV modes:

    .venv/bin/python bench/kv_copy_cost.py                     # the default model
    .venv/bin/python bench/kv_copy_cost.py --model PATH --ctx 4096 --rounds 8

`--move 64,512,2048` times instead what a parked prefix's `KvMove` costs (per-sequence
KV, scheduler/parking.py `packed_slot`): the prefix serialized out of its slot and into
another (`save_seq` then `load_seq`, as `EngineCore._move_kv` does); a host-tier save
(`save_seq` then `encode_blob`, as `KvOffload` spills a displaced prefix) and restore
(`decode_blob` then `load_seq`); beside the whole-stream copy a move avoids, for each
prefix length.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend
from inferflux.engine.kv_state import BlobHeader, decode_blob, encode_blob
from inferflux.models.files import default_model_path


def _prefill(backend: LlamaCppBackend, prefix: int) -> None:
    """Sequence 0 := `prefix` tokens, in steps of at most 512 (the context's n_batch)."""
    backend.free_seq(0)
    tokens = list(range(100, 100 + prefix))
    for start in range(0, prefix, 512):
        backend.decode([(0, tokens[start : start + 512], start, start + 512 >= prefix)])


def measure(backend: LlamaCppBackend, prefix: int, suffix: int, rounds: int) -> dict[str, float]:
    """Median ms of a `suffix`-token step after a copy, and without one."""
    _prefill(backend, prefix)
    after_copy: list[float] = []
    plain: list[float] = []
    tail = list(range(300, 300 + suffix))
    for k in range(2 * rounds):
        dst = 1 + k % 2
        backend.free_seq(dst)
        copied = k % 2 == 0
        if copied:
            backend.copy_seq(0, dst, prefix)
        started = time.perf_counter()
        backend.decode([(dst, tail, prefix if copied else 0, True)])
        (after_copy if copied else plain).append(1000 * (time.perf_counter() - started))
    return {"after_copy_ms": statistics.median(after_copy), "plain_ms": statistics.median(plain)}


def measure_move(
    backend: LlamaCppBackend, prefix: int, suffix: int, rounds: int
) -> dict[str, float]:
    """Median and worst ms of a `prefix`-token KvMove (save, then load into another slot),
    of a host-tier save (save, then the checked blob: `KvOffload`'s spill) and restore
    (the blob checked, then loaded), and the median of a `suffix`-token step after a
    whole-stream copy of it less the same step without one. The worst matters: a save
    that faults in fresh huge pages can stall for tens of ms (BENCHMARKS, eighteenth
    session), and a median of a few rounds hides it."""
    _prefill(backend, prefix)
    layout = backend.kv_layout()
    header = BlobHeader(model_id="bench", layout=layout, namespace="", token_ids=[0] * prefix)
    times: dict[str, list[float]] = {"move_ms": [], "save_ms": [], "restore_ms": []}
    for k in range(rounds):
        dst = 1 + k % 2
        started = time.perf_counter()
        moved = backend.load_seq(dst, backend.save_seq(0), prefix)
        saved_at = time.perf_counter()
        blob = encode_blob(header, backend.save_seq(0))
        restore_at = time.perf_counter()
        payload = decode_blob(blob, model_id="bench", layout=layout).payload
        restored = backend.load_seq(3 - dst, payload, prefix)
        done = time.perf_counter()
        assert moved and restored, "a load was refused"
        times["move_ms"].append(1000 * (saved_at - started))
        times["save_ms"].append(1000 * (restore_at - saved_at))
        times["restore_ms"].append(1000 * (done - restore_at))
        backend.free_seq(1)
        backend.free_seq(2)
    copy = measure(backend, prefix, suffix, rounds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    worst = {name.replace("_ms", "_max_ms"): max(values) for name, values in times.items()}
    return {**medians, **worst, "copy_ms": copy["after_copy_ms"] - copy["plain_ms"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--ctx", type=int, default=4096, help="cells per sequence (n_ctx_per_seq)")
    p.add_argument("--prefix", type=int, default=27)
    p.add_argument("--suffix", type=int, default=14)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--move", default="", help="prefix lengths: time KvMove instead")
    args = p.parse_args(argv)
    path = args.model or str(default_model_path())
    print(f"{os.path.basename(path)}, {args.ctx} cells a sequence, {args.threads} threads")
    if args.move:
        config = ContextConfig(path, args.ctx, 3, 512, args.threads, args.threads, False)
        backend = LlamaCppBackend(config)
        try:
            for prefix in (int(n) for n in args.move.split(",")):
                got = measure_move(backend, prefix, args.suffix, args.rounds)
                print(
                    f"{prefix} tokens, median (worst) of {args.rounds}: KvMove "
                    f"{got['move_ms']:.1f} ({got['move_max_ms']:.1f}) ms, host-tier save "
                    f"{got['save_ms']:.1f} ({got['save_max_ms']:.1f}) ms and restore "
                    f"{got['restore_ms']:.1f} ({got['restore_max_ms']:.1f}) ms, a "
                    f"whole-stream copy {got['copy_ms']:+.1f} ms on the next step"
                )
        finally:
            backend.close()
        return 0
    for unified in (False, True):
        config = ContextConfig(path, args.ctx, 3, 512, args.threads, args.threads, unified)
        backend = LlamaCppBackend(config)
        try:
            got = measure(backend, args.prefix, args.suffix, args.rounds)
        finally:
            backend.close()
        print(
            f"kv_unified={unified}: a {args.suffix}-token step {got['after_copy_ms']:.1f} ms "
            f"after a {args.prefix}-token copy, {got['plain_ms']:.1f} ms without "
            f"(the copy: {got['after_copy_ms'] - got['plain_ms']:+.1f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
