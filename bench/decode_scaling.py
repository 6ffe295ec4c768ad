"""How one llama_decode step scales with the number of sequences in it (no HTTP, no scheduler).

Prefills a 200-token prompt into each of B sequences, then times 40 decode steps that
carry one token of every sequence (greedy sampling included), for B = 1, 2, 4, 8, 16.
This is the hardware/kernel ceiling of continuous batching on this machine: if a step
of 16 tokens costs almost 16 steps of 1, no scheduler can make concurrency pay.

Usage:
    .venv/bin/python bench/decode_scaling.py                 # the default model
    .venv/bin/python bench/decode_scaling.py --model PATH --unified
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from inferflux.engine.backends.base import SamplerSpec
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend
from inferflux.models.files import default_model_path

GREEDY = SamplerSpec(0.0, 1.0, 0, 0.0, 1, 1.0, 0.0, 0.0, 64, (), True)
PROMPT = list(range(200, 400))


def measure(backend: LlamaCppBackend, batch: int, steps: int) -> tuple[float, float]:
    """(seconds per decode step, prefill tokens/s) for `batch` sequences."""
    for seq in range(16):
        backend.free_seq(seq)
    samplers = [backend.make_sampler(GREEDY) for _ in range(batch)]
    started = time.perf_counter()
    for seq in range(batch):
        backend.decode([(seq, PROMPT, 0, True)])
    prefill_s = time.perf_counter() - started
    tokens, pos = [1] * batch, [len(PROMPT)] * batch
    started = time.perf_counter()
    for _ in range(steps):
        rows = backend.decode([(s, [tokens[s]], pos[s], True) for s in range(batch)])
        for s in range(batch):
            tokens[s] = backend.sample(samplers[s], rows[s])
            pos[s] += 1
    step_s = (time.perf_counter() - started) / steps
    for sampler in samplers:
        sampler.close()
    return step_s, batch * len(PROMPT) / prefill_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--unified", action="store_true", help="kv_unified=true")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args(argv)
    path = args.model or str(default_model_path())
    config = ContextConfig(path, 1024, 16, 512, args.threads, args.threads, args.unified)
    backend = LlamaCppBackend(config)
    print(f"{os.path.basename(path)}, {args.threads} threads, kv_unified={args.unified}")
    print("| sequences | step ms | decode tok/s | vs 1 sequence | prefill tok/s |")
    print("| --- | --- | --- | --- | --- |")
    base = None
    for batch in (1, 2, 4, 8, 16):
        step_s, prefill = measure(backend, batch, args.steps)
        rate = batch / step_s
        base = base or rate
        print(
            f"| {batch} | {step_s * 1000:.1f} | {rate:.1f} | {rate / base:.2f}x | {prefill:.0f} |"
        )
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
