"""What the scheduler's own Python costs per engine step, from a laptop's 16 slots to a
GPU node's 256: `Scheduler.schedule()` plus the bookkeeping EngineCore does after a step
(finishes, parking), without llama.cpp.

On 2 CPU cores a step of a 135M model takes 6-60 ms and the scheduler's share is small;
on a GPU a step of 256 sequences takes 15-40 ms, and every millisecond the host spends
planning it is a millisecond the GPU idles (vLLM's and SGLang's reason for overlapping
scheduling with the forward pass). This drives the real `Scheduler`, with the prefix
cache and parked slots configured as `inferflux serve` configures them, through a steady
stream of chat-like requests: a shared system prompt of `--system` tokens, a unique
question, `--max-tokens` tokens of output, a new request arriving whenever one finishes
(so `--seqs` sequences decode at every step and one or more prompts are admitted), and
every `--turn-every`-th new request continuing an earlier conversation (its previous
prompt and answer plus a new question: the prefix cache's and parking's work).

The "engine" here is the bookkeeping of tests/unit/scheduler (advance computed counts,
append a token): it is a fake and is named so, and nothing is generated; what is
measured is only the scheduler's CPU. Reported per `--seqs`: µs of scheduler time per
step, per scheduled token, the steps measured, and the top functions of a cProfile run
(`--profile`).

    .venv/bin/python bench/scheduler_cost.py                       # 16, 64, 256 slots
    .venv/bin/python bench/scheduler_cost.py --seqs 256 --profile
    .venv/bin/python bench/scheduler_cost.py --digest   # a change's decisions, compared

`--digest` prints a SHA-256 over every step's decisions (each chunk's request, slot,
tokens, position and sampling flag; every KV operation): a change meant only to make the
scheduler faster must leave it as it was (run it on both commits).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import io
import json
import pstats
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from inferflux.scheduler import Request, Scheduler, SchedulerOutput
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import RequestStatus


class FakeClock:
    """A clock the benchmark advances by a fixed step time (a fake: no engine runs)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def build(seqs: int, batch_tokens: int, ctx: int, cache_slots: int) -> Scheduler:
    """A scheduler as `inferflux serve` builds one for per-sequence KV: a prefix cache
    over `cache_slots` slots after the running ones, parking on (reuse_in_place)."""
    cache = PrefixCache(
        list(range(seqs, seqs + cache_slots)),
        max_tokens=int(0.8 * cache_slots * ctx),
        min_match=16,
    )
    return Scheduler(
        max_num_seqs=seqs,
        max_batch_tokens=batch_tokens,
        kv_capacity=None,
        prefix_cache=cache,
        clock=FakeClock(),
        park=True,
    )


class Traffic:
    """Chat-like requests: a shared system prompt, then a question (or a conversation's
    earlier turns, then a question)."""

    def __init__(self, system: int, question: int, max_tokens: int, turn_every: int) -> None:
        self.rng = random.Random(7)
        self.system = [1000 + i for i in range(system)]
        self.question = question
        self.max_tokens = max_tokens
        self.turn_every = turn_every
        self.finished: list[list[int]] = []  # prompt + answer of finished requests
        self.count = 0

    def next(self) -> Request:
        self.count += 1
        words = [self.rng.randrange(2000, 40000) for _ in range(self.question)]
        if self.finished and self.count % self.turn_every == 0:
            prompt = self.finished.pop(self.rng.randrange(len(self.finished))) + words
        else:
            prompt = self.system + words
        return Request(f"r{self.count}", prompt, self.max_tokens)


def fake_token(request: Request) -> int:
    """The fake engine's next token: differs by request and position, like real answers
    (answers that agreed position by position would make every prefix check run long)."""
    n = len(request.output_token_ids)
    return 2 + (n * 7919 + zlib.crc32(request.request_id.encode())) % 40000


def fake_engine(out: SchedulerOutput) -> list[Request]:
    """EngineCore's bookkeeping after a step, minus llama.cpp (a fake: nothing is
    generated): computed counts advance, sampling rows append a token. Returns the
    requests that reached max_tokens."""
    done: list[Request] = []
    for chunk in out.chunks:
        request = chunk.request
        request.num_computed_tokens += len(chunk.token_ids)
        if chunk.sample:
            request.output_token_ids.append(fake_token(request))
            if len(request.output_token_ids) >= request.max_tokens:
                done.append(request)
    return done


def op_key(op: Any) -> tuple[Any, ...]:
    """A KV operation as plain values: its kind and fields, a request by its id (a
    request's repr holds its wall-clock arrival time, which differs from run to run)."""
    values = (getattr(op, f.name) for f in dataclasses.fields(op))
    return (type(op).__name__, *(v.request_id if isinstance(v, Request) else v for v in values))


def digest_step(digest: Any, out: SchedulerOutput) -> None:
    """Fold one step's decisions into `digest` (a hashlib object)."""
    for chunk in out.chunks:
        row = (chunk.request.request_id, chunk.seq_id, chunk.token_ids, chunk.start_pos)
        digest.update(repr((row, chunk.sample, chunk.draft_token_ids)).encode())
    digest.update(repr([op_key(op) for op in out.kv_ops]).encode())


def step(sched: Scheduler, traffic: Traffic, digest: Any = None) -> tuple[float, int]:
    """One step: the scheduler's seconds (schedule() and the finishes) and its tokens."""
    started = time.perf_counter()
    out = sched.schedule()
    elapsed = time.perf_counter() - started
    if digest is not None:
        digest.update(b"step")
        digest_step(digest, out)
    done = fake_engine(out)  # not timed
    started = time.perf_counter()
    finished = [sched.finish(request.request_id, cache=True)[1] for request in done]
    elapsed += time.perf_counter() - started
    if digest is not None:
        digest.update(repr([[op_key(op) for op in ops] for ops in finished]).encode())
    for request in done:
        traffic.finished.append(request.prompt_token_ids + request.output_token_ids)
        sched.add(traffic.next())
    return elapsed, out.num_tokens


def run(seqs: int, args: Any) -> dict[str, Any]:
    slots = seqs if args.cache_slots < 0 else args.cache_slots
    sched = build(seqs, args.batch_tokens, args.ctx, slots)
    clock = sched.clock
    assert isinstance(clock, FakeClock)
    traffic = Traffic(args.system, args.question, args.max_tokens, args.turn_every)
    for _ in range(seqs):
        sched.add(traffic.next())
    for _ in range(args.warmup):
        step(sched, traffic)
        clock.now += args.step_ms / 1000.0
    spent, tokens = 0.0, 0
    digest = hashlib.sha256() if args.digest else None
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    for _ in range(args.steps):
        elapsed, n = step(sched, traffic, digest)
        spent, tokens = spent + elapsed, tokens + n
        if len(traffic.finished) > 4 * seqs:
            del traffic.finished[:seqs]
        clock.now += args.step_ms / 1000.0
    if profiler is not None:
        profiler.disable()
    running = sum(r.status == RequestStatus.RUNNING for r in sched.running)
    row: dict[str, Any] = {
        "seqs": seqs,
        "steps": args.steps,
        "running_at_end": running,
        "tokens_per_step": round(tokens / args.steps, 1),
        "us_per_step": round(spent / args.steps * 1e6, 1),
        "us_per_token": round(spent / max(tokens, 1) * 1e6, 2),
    }
    if digest is not None:
        row["digest"] = digest.hexdigest()[:16]
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(args.sort).print_stats(args.top)
        row["profile"] = text.getvalue()
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seqs", default="16,64,256", help="max_num_seqs values, comma-separated")
    p.add_argument("--batch-tokens", type=int, default=8192, help="max_batch_tokens")
    p.add_argument("--ctx", type=int, default=4096, help="context per sequence")
    p.add_argument(
        "--cache-slots", type=int, default=-1, help="prefix-cache slots (-1: as many as --seqs)"
    )
    p.add_argument("--system", type=int, default=200, help="shared system-prompt tokens")
    p.add_argument("--question", type=int, default=40, help="tokens of each new question")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--turn-every", type=int, default=3, help="every Nth request continues")
    p.add_argument("--step-ms", type=float, default=20.0, help="the fake clock's step")
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    p.add_argument("--sort", default="tottime", help="cProfile sort key (tottime, cumulative)")
    p.add_argument("--top", type=int, default=12, help="functions the profile lists")
    p.add_argument("--digest", action="store_true", help="print a hash of every decision")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rows = []
    for seqs in (int(s) for s in args.seqs.split(",")):
        row = run(seqs, args)
        profile = row.pop("profile", None)
        print(json.dumps(row), flush=True)
        if profile:
            print(profile)
        rows.append(row)
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1),
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
