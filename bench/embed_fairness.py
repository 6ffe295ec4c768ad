"""Can one embeddings request slow every other tenant's chat? Chat latency alone and
while a large embeddings request runs on the same worker.

Starts `inferflux serve` (one worker, the default model unless --model), measures
`--chats` short chat completions one after another (non-streaming, greedy, `--chat-tokens`
tokens each: latency and time to first token from a streamed twin), then sends one
embeddings request of `--inputs` texts of about `--input-tokens` tokens each from another
thread and measures the same chats while it runs, then waits for it. Prints the chat
latencies (p50, max) alone and beside the embeddings, and how long the embeddings took.

The issue-30 probe: 2,048 inputs of about 141 tokens (under the 300k-token cap) took
other tenants' chats from 0.13 s to 2.4–2.9 s, because each engine step waited for a
512-token embedding pass. `scheduler.embed_tokens_per_step` bounds that pass while
generations run (`--embed-tokens-per-step` sets it on the server).

Usage:
    .venv/bin/python bench/embed_fairness.py                        # 512 inputs
    .venv/bin/python bench/embed_fairness.py --inputs 2048 --json out.json
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python bench/embed_fairness.py  # A/B
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import httpx

from launch import start_server

_SENTENCE = "The quarterly report describes revenue, costs and the outlook for next year. "


def chat_once(client: httpx.Client, url: str, tokens: int, index: int) -> tuple[float, float]:
    """One streamed greedy chat: (seconds to the last byte, seconds to the first token)."""
    body = {
        "messages": [{"role": "user", "content": f"Say hello to person number {index}."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and '"content":"' in line and '"content":""' not in line:
                first = time.perf_counter() - started
    total = time.perf_counter() - started
    return total, first if first is not None else total


def chats(client: httpx.Client, url: str, n: int, tokens: int) -> list[tuple[float, float]]:
    return [chat_once(client, url, tokens, i) for i in range(n)]


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    totals = [t for t, _ in samples]
    firsts = [f for _, f in samples]
    return {
        "latency_p50_s": round(statistics.median(totals), 3),
        "latency_max_s": round(max(totals), 3),
        "ttft_p50_s": round(statistics.median(firsts), 3),
        "ttft_max_s": round(max(firsts), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--port", type=int, default=18195)
    p.add_argument("--inputs", type=int, default=512)
    p.add_argument("--input-tokens", type=int, default=141, help="about this many each")
    p.add_argument("--chats", type=int, default=8)
    p.add_argument("--chat-tokens", type=int, default=16)
    p.add_argument("--embed-tokens-per-step", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    env = {}
    if args.embed_tokens_per_step is not None:
        env["INFERFLUX_SCHEDULER__EMBED_TOKENS_PER_STEP"] = str(args.embed_tokens_per_step)
    server = start_server(args.port, ["--model", args.model] if args.model else [], env)
    url = f"http://127.0.0.1:{args.port}"
    text = _SENTENCE * max(1, args.input_tokens // 14)  # about 14 tokens a sentence
    embed_result: dict[str, object] = {}

    def embed() -> None:
        started = time.perf_counter()
        with httpx.Client(timeout=3600) as client:
            response = client.post(f"{url}/v1/embeddings", json={"input": [text] * args.inputs})
        embed_result["status"] = response.status_code
        embed_result["seconds"] = round(time.perf_counter() - started, 2)
        if response.status_code == 200:
            embed_result["tokens"] = response.json()["usage"]["prompt_tokens"]

    try:
        with httpx.Client(timeout=600) as client:
            chats(client, url, 2, args.chat_tokens)  # warm up
            alone = chats(client, url, args.chats, args.chat_tokens)
            worker = threading.Thread(target=embed)
            worker.start()
            time.sleep(2.0)  # the embeddings are under way
            beside = chats(client, url, args.chats, args.chat_tokens)
            embedding_done = not worker.is_alive()
            worker.join()
    finally:
        server.terminate()
        server.wait(30)
    report = {
        "inputs": args.inputs,
        "alone": summary(alone),
        "beside_embeddings": summary(beside),
        "embeddings_still_running_after_the_chats": not embedding_done,
        "embeddings": embed_result,
    }
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
