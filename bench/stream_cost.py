"""What streaming one token costs outside llama.cpp: CPU and context switches per token.

Starts `inferflux serve` (one worker, the default model unless --model), streams
`--requests` greedy chat completions of `--max-tokens` tokens one after another
(`ignore_eos`, so every request makes all of them), and reads every thread of the API
process and of its worker from /proc before and after: CPU ms, voluntary and involuntary
context switches, per generated token (counted from the usage, so `--stream-interval N`,
which runs the server with `scheduler.stream_interval` N, is comparable). `--collect`
sends the same requests unstreamed (`stream: false`; the worker then sends their tokens
every 0.25 s, docs/scheduling.md). Linux only.

On a machine whose cores llama.cpp's threads fill, every wake-up of another thread
preempts a decode thread: the worker's `invol/token` (its llama.cpp threads preempted)
and the API's `cpu ms/token` are the numbers to drive down (BENCHMARKS.md "The output
channel").

Usage:
    .venv/bin/python bench/stream_cost.py                      # SmolLM2, 6 × 128 tokens
    .venv/bin/python bench/stream_cost.py --model PATH --requests 4 --json out.json
    .venv/bin/python bench/stream_cost.py --collect --requests 8  # unstreamed
    .venv/bin/python bench/stream_cost.py --collect --requests 16 --clients 4  # c = 4
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python bench/stream_cost.py  # A/B
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from launch import start_server

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ThreadSample:
    name: str
    voluntary: int
    involuntary: int
    cpu_s: float


def thread_samples(pid: int) -> dict[int, ThreadSample]:
    """Every thread of `pid`: its name, context switches and CPU seconds so far."""
    samples = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        samples[int(task.name)] = ThreadSample(
            name=name,
            voluntary=int(fields["voluntary_ctxt_switches"]),
            involuntary=int(fields["nonvoluntary_ctxt_switches"]),
            cpu_s=(int(stat[11]) + int(stat[12])) / _TICK,
        )
    return samples


def per_token(
    before: dict[int, ThreadSample], after: dict[int, ThreadSample], tokens: int
) -> dict[str, object]:
    """Per-token deltas of the threads alive at both samples, and their total."""
    threads = []
    total = [0.0, 0.0, 0.0]
    for tid, end in sorted(after.items()):
        start = before.get(tid)
        if start is None:
            continue
        row = [
            (end.voluntary - start.voluntary) / tokens,
            (end.involuntary - start.involuntary) / tokens,
            (end.cpu_s - start.cpu_s) * 1000 / tokens,
        ]
        total = [a + b for a, b in zip(total, row, strict=True)]
        threads.append(
            {
                "tid": tid,
                "name": end.name,
                "voluntary": row[0],
                "involuntary": row[1],
                "cpu_ms": row[2],
            }
        )
    return {"voluntary": total[0], "involuntary": total[1], "cpu_ms": total[2], "threads": threads}


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _worker_pid(api_pid: int) -> int:
    """The engine worker: the child of the API process with the most threads (the other
    child is multiprocessing's resource tracker)."""
    children = _children(api_pid)
    if not children:
        raise SystemExit("the server has no worker process (in-process mode?)")
    return max(children, key=lambda pid: len(list(Path(f"/proc/{pid}/task").iterdir())))


def stream(client: httpx.Client, url: str, body: dict[str, object]) -> tuple[int, int]:
    """Stream one completion: (tokens generated, from its usage; events with text)."""
    tokens = events = 0
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    events += 1 if choice.get("delta", {}).get("content") else 0
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    return tokens, events


def collect(client: httpx.Client, url: str, body: dict[str, object]) -> tuple[int, int]:
    """One unstreamed completion: (tokens generated, 0 events)."""
    response = client.post(url, json={**body, "stream": False, "stream_options": None})
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"]), 0


def _report(label: str, result: dict[str, object]) -> None:
    print(
        f"{label:7s} total: voluntary {result['voluntary']:.2f}  involuntary "
        f"{result['involuntary']:.2f}  cpu {result['cpu_ms']:.3f} ms  (per token)"
    )
    for thread in result["threads"]:  # type: ignore[attr-defined]
        if thread["cpu_ms"] > 0.005 or thread["voluntary"] + thread["involuntary"] > 0.05:
            print(
                f"  {thread['name']:16s} voluntary {thread['voluntary']:.2f}  involuntary "
                f"{thread['involuntary']:.2f}  cpu {thread['cpu_ms']:.3f} ms"
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--port", type=int, default=18190)
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads of the worker")
    p.add_argument(
        "--stream-interval", type=int, default=1, help="scheduler.stream_interval of the server"
    )
    p.add_argument("--collect", action="store_true", help="unstreamed requests (stream: false)")
    p.add_argument("--clients", type=int, default=1, help="requests in flight at once")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    send = collect if args.collect else stream

    env = {
        "INFERFLUX_RUNTIME__N_THREADS": str(args.threads),
        "INFERFLUX_SCHEDULER__STREAM_INTERVAL": str(args.stream_interval),
    }
    server = start_server(args.port, ["--model", args.model] if args.model else [], env)
    try:
        worker = _worker_pid(server.pid)
        url = f"http://127.0.0.1:{args.port}/v1/chat/completions"
        prompt = "Write a long story about a dragon and a knight, in detail."
        body: dict[str, object] = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(timeout=300) as client:
            send(client, url, {**body, "max_tokens": 8})  # warm up
            before = {pid: thread_samples(pid) for pid in (server.pid, worker)}
            started = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                results = list(pool.map(lambda _: send(client, url, body), range(args.requests)))
            wall_s = time.perf_counter() - started
            after = {pid: thread_samples(pid) for pid in (server.pid, worker)}
    finally:
        server.terminate()
        server.wait(30)
    tokens = sum(t for t, _ in results)
    events = sum(e for _, e in results)
    if tokens == 0:
        raise SystemExit("no tokens were streamed")
    api = per_token(before[server.pid], after[server.pid], tokens)
    engine = per_token(before[worker], after[worker], tokens)
    print(f"{tokens} tokens ({events} events) in {wall_s:.2f} s: {tokens / wall_s:.1f} tok/s")
    _report("api", api)
    _report("worker", engine)
    if args.json is not None:
        report = {
            "tokens": tokens,
            "events": events,
            "wall_s": wall_s,
            "api": api,
            "worker": engine,
            "args": vars(args),
        }
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
