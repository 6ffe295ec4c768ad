"""What a streamed token costs over gRPC (inferflux.v1 Chat) against SSE (/v1/chat/completions).

Starts `inferflux serve --grpc-port` (one worker, the default model unless --model,
`scheduler.max_num_seqs` = the highest level), then for each concurrency level (default
1 and 16) and each transport runs that many closed-loop clients (threads), `--requests`
greedy chat streams each, the same prompt and `max_tokens` on both transports (greedy,
so both generate the same tokens). Reports per transport and level: tokens, tok/s,
time to first token (p50), and the CPU ms per token of the API process and of its worker
(every thread, from /proc, as bench/stream_cost.py counts them). The gRPC bridge runs each
call through the same ASGI app in-process, so its overhead is the bridge plus protobuf
framing minus HTTP/1.1 + SSE. Linux only.

Usage:
    .venv/bin/python bench/grpc_overhead.py                          # 1 and 16, 4 × 128
    .venv/bin/python bench/grpc_overhead.py --levels 1 --requests 1 --max-tokens 8   # smoke
    .venv/bin/python bench/grpc_overhead.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx

from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.grpc.gen import inference_pb2_grpc as pb_grpc
from launch import start_server
from stream_cost import _worker_pid, per_token, thread_samples
from workload import percentile

PROMPT = "Write a long story about a dragon and a knight, in detail."
Stream = Callable[[], tuple[int, float]]  # one stream → (tokens, seconds to first token)


def sse_stream(url: str, max_tokens: int) -> Stream:
    client = httpx.Client(timeout=600)
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def run() -> tuple[int, float]:
        started, first, tokens = time.perf_counter(), 0.0, 0
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if not first and chunk.get("choices"):
                    first = time.perf_counter() - started
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return tokens, first

    return run


def grpc_stream(address: str, max_tokens: int) -> Stream:
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(address))
    request = pb.ChatRequest(
        messages=[pb.ChatMessage(role="user", content=PROMPT)],
        sampling=pb.Sampling(max_tokens=max_tokens, temperature=0),
    )

    def run() -> tuple[int, float]:
        started, first, tokens = time.perf_counter(), 0.0, 0
        for reply in stub.Chat(request, timeout=600):
            if not first:
                first = time.perf_counter() - started
            if reply.WhichOneof("event") == "finish":
                tokens = reply.finish.usage.completion_tokens
        return tokens, first

    return run


def run_level(streams: list[Stream], requests: int) -> tuple[int, list[float], float]:
    """Every client runs `requests` streams one after another: (tokens, TTFTs, wall s)."""
    results: list[tuple[int, float]] = []
    lock = threading.Lock()

    def client(stream: Stream) -> None:
        for _ in range(requests):
            outcome = stream()
            with lock:
                results.append(outcome)

    threads = [threading.Thread(target=client, args=(s,)) for s in streams]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started
    return sum(t for t, _ in results), [f for _, f in results], wall_s


def measure(
    make: Callable[[], Stream], level: int, requests: int, pids: tuple[int, int]
) -> dict[str, object]:
    streams = [make() for _ in range(level)]
    streams[0]()  # warm up (the connection, the prefix cache)
    before = [thread_samples(pid) for pid in pids]
    tokens, firsts, wall_s = run_level(streams, requests)
    after = [thread_samples(pid) for pid in pids]
    if tokens == 0:
        raise SystemExit("no tokens were streamed")
    api, worker = (per_token(b, a, tokens) for b, a in zip(before, after, strict=True))
    return {
        "tokens": tokens,
        "wall_s": wall_s,
        "tok_s": tokens / wall_s,
        "ttft_p50_ms": percentile(firsts, 50) * 1000,
        "api_cpu_ms_per_token": api["cpu_ms"],
        "worker_cpu_ms_per_token": worker["cpu_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--port", type=int, default=18290)
    p.add_argument("--grpc-port", type=int, default=18291)
    p.add_argument("--levels", default="1,16", help="concurrency levels, comma-separated")
    p.add_argument("--requests", type=int, default=4, help="streams per client and level")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads of the worker")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    levels = [int(level) for level in args.levels.split(",")]

    env = {
        "INFERFLUX_RUNTIME__N_THREADS": str(args.threads),
        "INFERFLUX_SCHEDULER__MAX_NUM_SEQS": str(max(levels)),
    }
    server_args = ["--grpc-port", str(args.grpc_port)]
    server = start_server(
        args.port, [*server_args, *(["--model", args.model] * bool(args.model))], env
    )
    url, address = f"http://127.0.0.1:{args.port}", f"127.0.0.1:{args.grpc_port}"
    transports: dict[str, Callable[[], Stream]] = {
        "sse": lambda: sse_stream(url, args.max_tokens),
        "grpc": lambda: grpc_stream(address, args.max_tokens),
    }
    rows: list[dict[str, object]] = []
    try:
        pids = (server.pid, _worker_pid(server.pid))
        for level in levels:
            for name, make in transports.items():
                row = {
                    "transport": name,
                    "level": level,
                    **measure(make, level, args.requests, pids),
                }
                rows.append(row)
                _print(row)
    finally:
        server.terminate()
        server.wait(30)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=2, default=str))
    return 0


def _print(row: dict[str, object]) -> None:
    print(
        f"{row['transport']:4s} c={row['level']:<3} {row['tokens']:6} tokens "
        f"{row['tok_s']:8.1f} tok/s  ttft p50 {row['ttft_p50_ms']:7.1f} ms  "
        f"api {row['api_cpu_ms_per_token']:.3f} ms/token  "
        f"worker {row['worker_cpu_ms_per_token']:.3f} ms/token",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
