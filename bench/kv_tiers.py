"""The prefix cache's host and disk tiers, and its persistence across restarts.

Three parts (`--parts`, default all):

- `cost`, per model (`--models`): bytes of KV per token, and per 1k tokens the time to
  prefill, to save a sequence (`llama_state_seq_get_data` + blob encoding), to restore
  it from RAM (checks + `llama_state_seq_set_data`) and from disk (a file written, then
  read back: page cache, so a lower bound for a cold NVMe read). This is what the
  restore rule (docs/kv-cache.md) compares online.
- `tiers`: the agent trace (bench/agent_trace.py's corpus) against a server whose prefix
  cache has fewer slots than the trace has conversations (`--slots`), with the lower
  tiers off, host only, disk only, and host + disk: prefix hit rate (slot hits and
  tier restores over lookups), cached tokens, TTFT of turns >= 2, tier counters, peak
  RSS of the process tree.
- `memory`: peak RSS of the server's process tree and output tok/s, per model and
  concurrency (`--concurrency`), with the default KV sizing, with Gemma's sliding-window
  cache cut to the window (`runtime.swa_full` false), and with that plus the unified
  buffer sized by tokens (`runtime.kv_cache_sizing` tokens), and llama-server under the
  same load at the same settings (16 sequences of 4096, as bench/compare starts it)
  for the 1.3× target. `--memory-modes` picks the configurations, `--rounds` repeats
  them in alternating order.
- `restart`: the first `--restart-after` turns of every conversation, then a restart,
  then the rest: TTFT of the turns after the restart on a warm server (no restart), a
  restarted one with persistence (its snapshot restored), and a cold one (restarted
  without it).

    .venv/bin/python bench/kv_tiers.py --json bench/results/kv_tiers.json
    .venv/bin/python bench/kv_tiers.py --parts cost,tiers --conversations 2 --turns 3  # smoke
    .venv/bin/python bench/kv_tiers.py --parts memory --models gemma3 --rounds 3 \
        --memory-modes tokens_swa_window,llama-server --json bench/results/kv_memory.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_trace import CORPUS, turn_config  # noqa: E402
from compare.models import model_path  # noqa: E402
from compare.rss import TreeSampler  # noqa: E402
from launch import kill_group, start_process, start_server  # noqa: E402
from serve_load import RequestResult, resolve_model, stream_one  # noqa: E402
from workload import make_prompts, summarize  # noqa: E402

MB = 1024 * 1024
TIER_MODES: dict[str, dict[str, str]] = {
    "tiers_off": {},
    "host": {"INFERFLUX_KV_CPU_PAGES": "512"},
    "disk": {"INFERFLUX_KV_CPU_PAGES": "0", "INFERFLUX_NVME_OFFLOAD_PATH": "{dir}"},
    "host_disk": {"INFERFLUX_KV_CPU_PAGES": "64", "INFERFLUX_NVME_OFFLOAD_PATH": "{dir}"},
}


# -- cost ------------------------------------------------------------------------------
def measure_cost(key: str, n_tokens: int, repeats: int) -> dict[str, Any]:
    """Per 1k tokens: prefill, save, restore from RAM, restore from disk; bytes/token."""
    import numpy as np

    from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend
    from inferflux.engine.kv_state import BlobHeader, decode_blob, encode_blob

    backend = LlamaCppBackend(ContextConfig(model_path(key), n_tokens + 16, 2, 512, 2, 2, False))
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(100, 5000, n_tokens)]
    layout = backend.kv_layout()
    timings: dict[str, list[float]] = {
        "prefill": [],
        "save": [],
        "restore_ram": [],
        "restore_disk": [],
    }
    nbytes = 0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "blob.kv"
        for _ in range(repeats):
            backend.free_seq(0)
            started = time.perf_counter()
            for start in range(0, n_tokens, 512):
                backend.decode([(0, tokens[start : start + 512], start, 0)])
            timings["prefill"].append(time.perf_counter() - started)
            started = time.perf_counter()
            header = BlobHeader(model_id="bench", layout=layout, namespace="", token_ids=tokens)
            blob = encode_blob(header, backend.save_seq(0))
            timings["save"].append(time.perf_counter() - started)
            nbytes = len(blob)
            started = time.perf_counter()
            checked = decode_blob(blob, model_id="bench", layout=layout)
            assert backend.load_seq(1, checked.payload, n_tokens)
            timings["restore_ram"].append(time.perf_counter() - started)
            path.write_bytes(blob)
            started = time.perf_counter()
            checked = decode_blob(path.read_bytes(), model_id="bench", layout=layout)
            assert backend.load_seq(1, checked.payload, n_tokens)
            timings["restore_disk"].append(time.perf_counter() - started)
    backend.close()
    per_1k = {f"{k}_s_per_1k": round(min(v) * 1000 / n_tokens, 5) for k, v in timings.items()}
    return {"model": key, "tokens": n_tokens, "bytes_per_token": nbytes // n_tokens, **per_1k}


# -- the trace against servers -----------------------------------------------------------
async def _turns(
    url: str, corpus: list[dict[str, Any]], max_tokens: int, first: int, last: int,
    histories: dict[str, list[dict[str, str]]],
) -> list[tuple[int, RequestResult]]:  # fmt: skip
    """Turns first..last-1 of every conversation, concurrently; (turn number, result)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        config = turn_config(url, await resolve_model(client), max_tokens)

        async def one(conv: dict[str, Any]) -> list[tuple[int, RequestResult]]:
            messages = histories.setdefault(
                conv["id"],
                [] if conv["system"] is None else [{"role": "system", "content": conv["system"]}],
            )
            out = []
            for n, turn in enumerate(conv["turns"][first:last], start=first + 1):
                messages.append(turn)
                result = await stream_one(client, config, list(messages))
                messages.append({"role": "assistant", "content": result.text})
                out.append((n, result))
            return out

        per_conv = await asyncio.gather(*(one(c) for c in corpus))
    return [item for conv in per_conv for item in conv]


def _stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/server/stats", timeout=30).json())


def _server(port: int, args: list[str], env: dict[str, str]) -> tuple[Any, TreeSampler]:
    server = start_server(port, args=args, env=env)
    return server, TreeSampler(server.pid)


def _stop(server: Any, sampler: TreeSampler, *, graceful: bool = True) -> int:
    peak = sampler.stop().tree
    if graceful:
        server.terminate()
        server.wait(60)
    kill_group(server)
    return int(peak)


def run_tiers(args: argparse.Namespace, corpus: list[dict[str, Any]]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    url = f"http://127.0.0.1:{args.port}"
    for mode, extra in TIER_MODES.items():
        with tempfile.TemporaryDirectory() as folder:
            env = {**_base_env(args), **{k: v.format(dir=folder) for k, v in extra.items()}}
            server, sampler = _server(args.port, ["--model", model_path(args.model)], env)
            try:
                started = time.perf_counter()
                results = asyncio.run(_turns(url, corpus, args.max_tokens, 0, args.turns, {}))
                wall = time.perf_counter() - started
                stats = _stats(url)
            finally:
                peak = _stop(server, sampler)
        report[mode] = _summary(results, stats, wall, peak)
        print(mode, json.dumps(report[mode]), flush=True)
    return report


def _base_env(args: argparse.Namespace) -> dict[str, str]:
    return {"INFERFLUX_SCHEDULER__PREFIX_CACHE__SLOTS": str(args.slots)}


def _summary(
    results: list[tuple[int, RequestResult]], stats: dict[str, Any], wall: float, peak: int
) -> dict[str, Any]:
    prefix = stats.get("prefix_cache") or {}
    tiers = stats.get("kv_tiers") or {}
    lookups = prefix.get("hits", 0) + prefix.get("misses", 0)
    slot_hits = prefix.get("hits", 0)
    restores = tiers.get("restores", 0)
    later = [r.ttft_s for n, r in results if n >= 2 and r.ttft_s]
    cached = sum(r.cached_tokens or 0 for _, r in results)
    prompt = sum(r.prompt_tokens or 0 for _, r in results)
    return {
        "wall_s": round(wall, 2),
        "errors": [r.error for _, r in results if not r.ok],
        # lookups that reused KV from a slot or a tier (a lookup can do both: a short
        # slot match, then a longer restore; capped at 1), and reused prompt tokens
        "hit_rate": round(min(lookups, slot_hits + restores) / lookups, 3) if lookups else None,
        "token_hit_rate": round(cached / prompt, 3) if prompt else None,
        "slot_hits": slot_hits,
        "tier_restores": restores,
        "cached_tokens": cached,
        "prompt_tokens": prompt,
        "ttft_turn2plus": summarize(later).as_dict() if later else None,
        "kv_tiers": tiers or None,
        "peak_rss_tree_mb": round(peak / MB, 1),
    }


def run_restart(args: argparse.Namespace, corpus: list[dict[str, Any]]) -> dict[str, Any]:
    url = f"http://127.0.0.1:{args.port}"
    split = args.restart_after
    report: dict[str, Any] = {}
    for scenario in ("warm", "persisted", "cold"):
        with tempfile.TemporaryDirectory() as folder:
            env = {
                **_base_env(args),
                "INFERFLUX_KV_CPU_PAGES": "64",
                "INFERFLUX_NVME_OFFLOAD_PATH": folder,
                "INFERFLUX_RUNTIME__KV_PERSISTENCE__ENABLED": "true",
            }
            cli = ["--model", model_path(args.model)]
            histories: dict[str, list[dict[str, str]]] = {}
            server, sampler = _server(args.port, cli, env)
            try:
                asyncio.run(_turns(url, corpus, args.max_tokens, 0, split, histories))
                if scenario != "warm":
                    _stop(server, sampler)
                    if scenario == "cold":
                        env["INFERFLUX_RUNTIME__KV_PERSISTENCE__ENABLED"] = "false"
                    started = time.perf_counter()
                    server, sampler = _server(args.port, cli, env)
                    ready_s = time.perf_counter() - started
                else:
                    ready_s = 0.0
                after = asyncio.run(
                    _turns(url, corpus, args.max_tokens, split, split + 1, histories)
                )
                stats = _stats(url)
            finally:
                _stop(server, sampler)
        ttfts = [r.ttft_s for _, r in after if r.ttft_s]
        report[scenario] = {
            "restart_to_ready_s": round(ready_s, 2),
            "ttft_next_turn": summarize(ttfts).as_dict() if ttfts else None,
            "cached_tokens": sum(r.cached_tokens or 0 for _, r in after),
            "prompt_tokens": sum(r.prompt_tokens or 0 for _, r in after),
            "kv_tiers": stats.get("kv_tiers"),
        }
        print(scenario, json.dumps(report[scenario]), flush=True)
    return report


MEMORY_MODES: dict[str, dict[str, str]] = {
    "slots": {},
    "swa_window": {"INFERFLUX_RUNTIME__SWA_FULL": "false"},
    "tokens_swa_window": {
        "INFERFLUX_RUNTIME__SWA_FULL": "false",
        "INFERFLUX_RUNTIME__KV_UNIFIED": "true",
        "INFERFLUX_RUNTIME__KV_CACHE_SIZING": "tokens",
    },
}


async def _load(url: str, concurrency: int, n_requests: int, max_tokens: int) -> dict[str, Any]:
    """`n_requests` chats, `concurrency` at a time; output tok/s and TTFT p50."""
    prompts = make_prompts(n_requests, 11, 150, 200)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        config = turn_config(url, await resolve_model(client), max_tokens, ignore_eos=True)
        gate = asyncio.Semaphore(concurrency)

        async def one(text: str) -> RequestResult:
            async with gate:
                return await stream_one(client, config, [{"role": "user", "content": text}])

        started = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        wall = time.perf_counter() - started
    ttfts = [r.ttft_s for r in results if r.ttft_s]
    return {
        "output_tok_s": round(sum(r.output_tokens for r in results) / wall, 2),
        "ttft_p50_s": summarize(ttfts).p50 if ttfts else None,
        "errors": [r.error for r in results if not r.ok],
    }


def run_memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Peak RSS of the process tree and throughput per memory setting, model and
    concurrency (same context per sequence and max_num_seqs throughout). With
    `--rounds` > 1 every configuration runs once per round, in alternating order, so a
    slow minute on the machine falls on all of them alike."""
    rows = []
    url = f"http://127.0.0.1:{args.port}"
    modes = [m for m in args.memory_modes.split(",") if m]
    for key in args.models.split(","):
        for round_no in range(args.rounds):
            order = modes if round_no % 2 == 0 else modes[::-1]
            for mode in order:
                for concurrency in (int(c) for c in args.concurrency.split(",")):
                    server = _memory_server(args, key, url, mode)
                    sampler = TreeSampler(server.pid)
                    try:
                        requests = args.memory_requests * concurrency
                        load = asyncio.run(_load(url, concurrency, requests, args.max_tokens))
                    finally:
                        peak = round(_stop(server, sampler) / MB, 1)
                    row = {"model": key, "mode": mode, "concurrency": concurrency}
                    rows.append(row | {"round": round_no, **load, "peak_rss_tree_mb": peak})
                    print("memory", json.dumps(rows[-1]), flush=True)
    return rows


def _memory_server(args: argparse.Namespace, key: str, url: str, mode: str) -> Any:
    """InferFlux with the settings of `mode`, or for `llama-server` that server as
    bench/compare starts it: 16 sequences of the same context (`-np 16 -c 16 × 4096`),
    the same threads."""
    if mode != "llama-server":
        env = {**_base_env(args), **MEMORY_MODES[mode]}
        return start_server(args.port, args=["--model", model_path(key)], env=env)
    from compare import toolchain
    from compare.models import load_model
    from compare.servers import Toolchain, make_server

    tools = Toolchain(toolchain.llama_server().binary, None)
    server = make_server("llama-server", tools, load_model(key), args.port, 16)
    return start_process(server.argv, f"{url}{server.ready_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="cost,tiers,restart,memory")
    parser.add_argument("--models", default="smollm2,gemma3", help="for the cost part")
    parser.add_argument("--model", default="smollm2", help="for the trace parts")
    parser.add_argument("--cost-tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=0, help="0 = the whole corpus")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--restart-after", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", default="1,16", help="for the memory part")
    parser.add_argument("--memory-requests", type=int, default=2, help="per concurrency slot")
    parser.add_argument(
        "--memory-modes",
        default=",".join([*MEMORY_MODES, "llama-server"]),
        help="memory part: InferFlux settings (MEMORY_MODES) and llama-server (built into "
        ".cache/compare, started as bench/compare does)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="memory part: alternated rounds")
    parser.add_argument("--port", type=int, default=8095)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    corpus = [json.loads(line) for line in CORPUS.read_text().splitlines() if line]
    if args.conversations:
        corpus = corpus[: args.conversations]
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}}
    if "cost" in parts:
        report["cost"] = [
            measure_cost(m, args.cost_tokens, args.repeats) for m in args.models.split(",")
        ]
        print("cost", json.dumps(report["cost"], indent=1), flush=True)
    if "tiers" in parts:
        report["tiers"] = run_tiers(args, corpus)
    if "restart" in parts:
        report["restart"] = run_restart(args, corpus)
    if "memory" in parts:
        report["memory"] = run_memory(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
