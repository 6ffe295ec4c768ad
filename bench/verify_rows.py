"""What a verification step costs by its number of logits rows: one sequence, one
`llama_decode` of N rows over a context of `--context` tokens, each row then sampled as
a verified row is (greedy chain). The goodput gate's cost model (engine/spec_cost.py,
docs/speculative.md) is fitted to such steps at worker start; this shows the whole curve.

    .venv/bin/python bench/verify_rows.py --model gemma3
    .venv/bin/python bench/verify_rows.py --model smollm2 --rows 1,2,8,32 --json /tmp/rows.json
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
from inferflux.engine.backends.base import SamplerSpec
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend

GREEDY = SamplerSpec(
    temperature=0.0,
    top_p=1.0,
    top_k=40,
    min_p=0.05,
    seed=1,
    repeat_penalty=1.0,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    penalty_last_n=64,
    logit_bias=(),
    ignore_eos=False,
)


def measure(backend: LlamaCppBackend, context: int, rows: int, repeats: int) -> tuple[float, float]:
    """Median (decode s, sampling s) of a `rows`-row step after `context` tokens."""
    vocab = backend.n_vocab
    tokens = [(i * 7919) % (vocab - 1) + 1 for i in range(context + rows)]
    sampler = backend.make_sampler(GREEDY)
    backend.free_seq(0)
    for start in range(0, context, 256):
        backend.decode([(0, tokens[start : min(start + 256, context)], start, 0)])
    samples = []
    for _ in range(repeats + 1):  # the first is a warm-up
        started = time.perf_counter()
        last = backend.decode([(0, tokens[context:], context, rows)])
        decoded = time.perf_counter()
        for row in range(last[0] - rows + 1, last[0] + 1):
            backend.sample(sampler, row)
        samples.append((decoded - started, time.perf_counter() - decoded))
        backend.trim_seq(0, context)
    sampler.close()
    backend.free_seq(0)
    return (
        statistics.median(s[0] for s in samples[1:]),
        statistics.median(s[1] for s in samples[1:]),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3", help="smollm2 or gemma3 (bench/compare)")
    p.add_argument("--rows", default="1,2,4,8,16,24,33,48")
    p.add_argument("--context", type=int, default=600)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    model = load_model(args.model)
    widths = [int(x) for x in args.rows.split(",")]
    n_ctx = args.context + max(widths) + 16
    config = ContextConfig(model.path, n_ctx, 1, 512, args.threads, args.threads, False)
    backend = LlamaCppBackend(config)
    out = []
    for rows in widths:
        decode_s, sample_s = measure(backend, args.context, rows, args.repeats)
        out.append({"rows": rows, "decode_ms": decode_s * 1000, "sample_ms": sample_s * 1000})
    backend.close()
    print(f"{os.path.basename(model.path)}, {args.threads} threads, context {args.context}")
    print("\n".join(table(out)))
    if args.json is not None:
        report = {"model": model.path, "context": args.context, "rows": out}
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


def table(out: list[dict[str, float]]) -> list[str]:
    """Markdown: each step's decode and sampling ms, its cost in one-row steps, and what
    each row past the previous width added."""
    lines = [
        "| rows | decode ms | sampling ms | × one-row step | per row past the previous |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    one = out[0]["decode_ms"] + out[0]["sample_ms"]
    before: dict[str, float] | None = None
    for row in out:
        total = row["decode_ms"] + row["sample_ms"]
        step = ""
        if before is not None:
            added = total - before["decode_ms"] - before["sample_ms"]
            step = f"{added / (row['rows'] - before['rows']) / one:.2f}"
        lines.append(
            f"| {row['rows']:.0f} | {row['decode_ms']:.1f} | {row['sample_ms']:.2f} "
            f"| {total / one:.2f} | {step} |"
        )
        before = row
    return lines


if __name__ == "__main__":
    sys.exit(main())
