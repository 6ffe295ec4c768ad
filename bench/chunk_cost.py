"""What a prompt token costs by the size of the chunk it is computed in (no HTTP, no scheduler).

Stall-free steps (`scheduler.itl_target_ratio` / `itl_target_ms`) prefill a prompt in
small chunks beside the decode rows of other sequences. This measures the price: for
chunk sizes 8..512, the ms per prompt token of a step carrying one chunk of a 512-token
prompt, alone and beside D decode rows (their own cost, timed in decode-only steps of
the same D sequences, subtracted). Median of `--repeats` steps per size.

Usage:
    .venv/bin/python bench/chunk_cost.py                        # SmolLM2, D = 8
    .venv/bin/python bench/chunk_cost.py --model gemma --decoding 16 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from compare.models import load_model
from inferflux.engine.backends.base import DecodeChunk
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend

PROMPT = [200 + (i * 37) % 1000 for i in range(512)]
CONTEXT = [300 + (i * 11) % 1000 for i in range(200)]
CHUNKS = (8, 16, 32, 64, 128, 256, 512)


def _timed(backend: LlamaCppBackend, plan: list[DecodeChunk]) -> float:
    started = time.perf_counter()
    backend.decode(plan)
    return time.perf_counter() - started


def _decode_rows(decoding: int, step: int) -> list[DecodeChunk]:
    return [(1 + s, [5 + step % 7], len(CONTEXT) + step, 1) for s in range(decoding)]


def measure(backend: LlamaCppBackend, decoding: int, chunk: int, repeats: int) -> float:
    """Median seconds per prompt token of `chunk`-token chunks beside `decoding` rows."""
    samples = []
    for step in range(repeats):
        for seq in range(decoding + 1):
            backend.free_seq(seq)
        for s in range(decoding):
            backend.decode([(1 + s, CONTEXT, 0, 0)])
        base = _timed(backend, _decode_rows(decoding, 0)) if decoding else 0.0
        pos, costs = 0, []
        while pos + chunk <= len(PROMPT):
            rows = _decode_rows(decoding, 1 + pos // chunk)
            plan = [(0, PROMPT[pos : pos + chunk], pos, int(pos + chunk == len(PROMPT))), *rows]
            costs.append(_timed(backend, plan) - base)
            pos += chunk
            if len(costs) >= 4:
                break
        samples.append(statistics.median(costs) / chunk)
        del step
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="smollm2 or gemma3 (bench/compare)")
    p.add_argument("--decoding", type=int, default=8, help="decode rows beside the chunk")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    model = load_model(args.model)
    n_seq = args.decoding + 1
    config = ContextConfig(model.path, 1024, n_seq, 512 + n_seq, args.threads, args.threads, False)
    backend = LlamaCppBackend(config)
    print(f"{os.path.basename(model.path)}, {args.threads} threads, {args.decoding} decoding")
    print("| chunk | ms/token alone | ms/token beside decodes | vs 512 alone |")
    print("| ---: | ---: | ---: | ---: |")
    rows = []
    for chunk in CHUNKS:
        alone = measure(backend, 0, chunk, args.repeats)
        beside = measure(backend, args.decoding, chunk, args.repeats)
        rows.append({"chunk": chunk, "alone_ms": alone * 1000, "beside_ms": beside * 1000})
    ref = rows[-1]["alone_ms"]
    for row in rows:
        print(
            f"| {row['chunk']} | {row['alone_ms']:.2f} | {row['beside_ms']:.2f} "
            f"| {row['alone_ms'] / ref:.2f}× |"
        )
    backend.close()
    if args.json is not None:
        report = {"model": model.path, "decoding": args.decoding, "rows": rows}
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
