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
from serve_load import LoadConfig, RequestResult, resolve_model, stream_one
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


def turn_config(url: str, model: str, max_tokens: int, ignore_eos: bool = False) -> LoadConfig:
    """serve_load's request settings for one agent turn (greedy, streaming, usage)."""
    return LoadConfig(
        url=url,
        model=model,
        endpoint="chat",
        max_tokens=max_tokens,
        requests_per_client=1,
        seed=0,
        min_words=1,
        max_words=1,
        ignore_eos=ignore_eos,
    )


async def replay_conversation(
    client: httpx.AsyncClient, config: LoadConfig, conversation: dict[str, Any]
) -> list[RequestResult]:
    """Each turn in order, its answer appended to the history; one result per turn.
    A conversation whose "system" is None starts without a system message."""
    system = conversation["system"]
    messages = [] if system is None else [{"role": "system", "content": system}]
    results = []
    for turn in conversation["turns"]:
        messages.append(turn)
        result = await stream_one(client, config, list(messages))
        messages.append({"role": "assistant", "content": result.text})
        results.append(result)
    return results


async def replay_turns(
    client: httpx.AsyncClient, config: LoadConfig, corpus: list[dict[str, Any]]
) -> tuple[list[list[RequestResult]], float]:
    """All conversations concurrently: (per conversation, its turns' results), wall s."""
    started = time.perf_counter()
    per_conv = await asyncio.gather(*(replay_conversation(client, config, c) for c in corpus))
    return list(per_conv), time.perf_counter() - started


def ttft_summaries(per_conv: list[list[RequestResult]]) -> dict[str, Any]:
    """TTFT over all turns and over turns >= 3 (where earlier turns can be reused)."""
    turns = [(n + 1, r.ttft_s) for conv in per_conv for n, r in enumerate(conv) if r.ttft_s]
    return {
        "ttft_all": summarize([t for _, t in turns]).as_dict(),
        "ttft_turn3plus": summarize([t for n, t in turns if n >= 3]).as_dict(),
    }


async def replay(url: str, corpus: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        config = turn_config(url, await resolve_model(client), max_tokens)
        before = (await client.get("/server/stats")).json()
        per_conv, wall = await replay_turns(client, config, corpus)
        after = (await client.get("/server/stats")).json()
    turns = [t for conv in per_conv for t in conv]
    return {
        "wall_s": round(wall, 2),
        **ttft_summaries(per_conv),
        "errors": [t.error for t in turns if not t.ok],
        "prompt_tokens": sum(t.prompt_tokens or 0 for t in turns),
        "cached_tokens": sum(t.cached_tokens or 0 for t in turns),
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
