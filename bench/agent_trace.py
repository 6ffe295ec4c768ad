"""Agent-trace replay: multi-turn conversations with the prefix cache on and off.

The corpus (`bench/data/agent_traces.jsonl`, made by `--make-corpus` from a seed and
committed) holds conversations shaped like agent sessions: one long shared system prompt
with tool descriptions, then turns that each add a user message or a tool result. The
replay runs the conversations interleaved (all of them concurrently, one client each;
every client sends its next turn when the previous answer has arrived, appending the
answer to its history), against a fresh server with the prefix cache on, then off.

Per mode it reports: TTFT p50/p99 over all turns and over turns >= 3, the prefix hit rate
(hits / lookups, from /server/stats), prompt tokens the engine computed, and
`usage.prompt_tokens_details.cached_tokens` summed over requests.

    .venv/bin/python bench/agent_trace.py --make-corpus      # rewrite the corpus
    .venv/bin/python bench/agent_trace.py --json bench/results/agent_trace.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx

from launch import start_server
from workload import make_prompts, summarize

CORPUS = Path(__file__).resolve().parent / "data" / "agent_traces.jsonl"

_TOOLS = (
    "search_web(query): search the web and return the top results",
    "read_file(path): return the text of a file in the workspace",
    "run_tests(target): run the test suite and return the failures",
    "write_file(path, text): replace the text of a file",
    "list_dir(path): list the files of a directory",
    "http_get(url): fetch a URL and return its body",
)


def make_corpus(n_conversations: int, n_turns: int, seed: int) -> list[dict[str, Any]]:
    """Seeded conversations: shared system prompt, then user / tool-result turns."""
    rng = random.Random(seed)
    system = (
        "You are a coding agent. Think step by step, call tools when you need facts, "
        "and answer briefly. Tools:\n" + "\n".join(f"- {t}" for t in _TOOLS) + "\n"
        "Rules: never invent file contents; cite the tool output you rely on; when a "
        "test fails, read the file before you change it; keep answers under 80 words."
    )
    texts = make_prompts(n_conversations * n_turns, seed, 20, 60)
    conversations = []
    for c in range(n_conversations):
        turns = []
        for t in range(n_turns):
            text = texts[c * n_turns + t]
            if t > 0 and rng.random() < 0.5:
                tool = rng.choice(_TOOLS).split("(")[0]
                turns.append({"role": "user", "content": f"[tool result of {tool}]\n{text}"})
            else:
                turns.append({"role": "user", "content": text})
        conversations.append({"id": f"conv-{c}", "system": system, "turns": turns})
    return conversations


async def one_turn(
    client: httpx.AsyncClient, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    text.append(piece)
            if event.get("usage"):
                usage = event["usage"]
    details = usage.get("prompt_tokens_details") or {}
    return {
        "ttft_s": ttft if ttft is not None else time.perf_counter() - started,
        "text": "".join(text),
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "cached_tokens": details.get("cached_tokens", 0),
    }


async def replay_conversation(
    client: httpx.AsyncClient, conversation: dict[str, Any], max_tokens: int
) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": conversation["system"]}]
    results = []
    for index, turn in enumerate(conversation["turns"]):
        messages.append(turn)
        result = await one_turn(client, messages, max_tokens)
        result["turn"] = index + 1
        messages.append({"role": "assistant", "content": result.pop("text")})
        results.append(result)
    return results


async def replay(url: str, corpus: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        before = (await client.get("/server/stats")).json()
        started = time.perf_counter()
        per_conv = await asyncio.gather(
            *(replay_conversation(client, c, max_tokens) for c in corpus)
        )
        wall = time.perf_counter() - started
        after = (await client.get("/server/stats")).json()
    turns = [t for conv in per_conv for t in conv]
    return {
        "wall_s": round(wall, 2),
        "ttft_all": summarize([t["ttft_s"] for t in turns]).as_dict(),
        "ttft_turn3plus": summarize([t["ttft_s"] for t in turns if t["turn"] >= 3]).as_dict(),
        "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
        "cached_tokens": sum(t["cached_tokens"] for t in turns),
        "prompt_tokens_computed": _worker_sum(after, before, "num_prompt_tokens_total"),
        "prefix": _prefix(after),
    }


def _worker_sum(after: dict[str, Any], before: dict[str, Any], key: str) -> int:
    return sum(w[key] for w in after["workers"]) - sum(w[key] for w in before["workers"])


def _prefix(stats: dict[str, Any]) -> dict[str, Any] | None:
    caches = [w["prefix_cache"] for w in stats["workers"] if w.get("prefix_cache")]
    if not caches:
        return None
    hits = sum(c["hits"] for c in caches)
    lookups = hits + sum(c["misses"] for c in caches)
    return {
        "hits": hits,
        "lookups": lookups,
        "hit_rate": round(hits / lookups, 3) if lookups else None,
        "matched_tokens": sum(c["matched_tokens"] for c in caches),
        "evictions": sum(c["evictions"] for c in caches),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--make-corpus", action="store_true")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--port", type=int, default=8093)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.make_corpus:
        CORPUS.parent.mkdir(parents=True, exist_ok=True)
        corpus = make_corpus(args.conversations, args.turns, args.seed)
        CORPUS.write_text("".join(json.dumps(c) + "\n" for c in corpus))
        print(f"wrote {len(corpus)} conversations to {CORPUS}")
        return 0
    corpus = [json.loads(line) for line in CORPUS.read_text().splitlines() if line]
    report: dict[str, Any] = {"conversations": len(corpus), "max_tokens": args.max_tokens}
    for mode in ("cache_on", "cache_off"):
        enabled = "true" if mode == "cache_on" else "false"
        server = start_server(
            args.port, env={"INFERFLUX_SCHEDULER__PREFIX_CACHE__ENABLED": enabled}
        )
        try:
            report[mode] = asyncio.run(
                replay(f"http://127.0.0.1:{args.port}", corpus, args.max_tokens)
            )
        finally:
            server.terminate()
            server.wait(30)
        print(mode, json.dumps(report[mode], indent=1))
    on, off = report["cache_on"], report["cache_off"]
    report["ttft_p50_ratio_turn3plus_off_over_on"] = round(
        off["ttft_turn3plus"]["p50"] / on["ttft_turn3plus"]["p50"], 2
    )
    print("TTFT p50 (turns >= 3) off/on:", report["ttft_p50_ratio_turn3plus_off_over_on"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
