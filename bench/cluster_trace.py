"""The multi-turn agent trace across replicas: router round_robin vs prefix_affinity
(issue 19), and the same inside one server with `--workers 2`.

Conversations come from `agent_trace.make_corpus` (agent-shaped: a long tool-describing
system prompt, then user / tool-result turns; every client sends its next turn when the
previous answer arrived). Scenarios, each the "collapse" case a cache-aware router must
survive:
- `hot_system`: every conversation shares the one system prompt;
- `long_short`: one long conversation (3x the turns) plus many short ones without it;
- `restart`: `hot_system` while replica 1 is killed (-9) mid-run and restarted on its
  port (in `--workers` mode the server is not restarted: that mode is skipped).
Modes: `router_round_robin`, `router_prefix_affinity` (`--replicas` fresh `inferflux
serve` replicas, one thread each, behind `inferflux router`), and `workers_round_robin`,
`workers_prefix_affinity` (one server, `--workers 2 --routing ...`, the in-server
strategies; a server without that flag is reported as not run).

Per scenario and mode: prefix hit rate (the share of reusable prompt tokens that were
cached: for turn n >= 2 the reusable tokens are turn n-1's prompt and answer, and
`usage.prompt_tokens_details.cached_tokens` says how many were cached), TTFT p50 of
turns >= 2, and the load ratio (max / min requests per replica from /router/stats, per
worker from the prefix-cache lookups of /server/stats). Output: JSON and a markdown table.

    .venv/bin/python bench/cluster_trace.py --json bench/results/cluster_trace.json \\
        --markdown bench/results/cluster_trace.md
    .venv/bin/python bench/cluster_trace.py --conversations 2 --turns 2 --replicas 2 \\
        --scenarios hot_system --modes router_prefix_affinity      # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx

from agent_trace import make_corpus, replay_turns, turn_config
from launch import INFERFLUX, kill_group, start_process, start_server
from serve_load import RequestResult, resolve_model
from workload import summarize

SCENARIOS = ("hot_system", "long_short", "restart")
MODES = (
    "router_round_robin",
    "router_prefix_affinity",
    "workers_round_robin",
    "workers_prefix_affinity",
)
REPLICA_ENV = {"INFERFLUX_RUNTIME__N_THREADS": "1"}


def scenario_corpus(name: str, conversations: int, turns: int, seed: int) -> list[dict[str, Any]]:
    if name != "long_short":
        return make_corpus(conversations, turns, seed)
    (long,) = make_corpus(1, 3 * turns, seed)
    short = make_corpus(2 * conversations, 2, seed + 1)
    for conversation in short:
        conversation["system"] = None  # nothing shared with the long one
    return [long, *short]


def trace_metrics(per_conv: list[list[RequestResult]]) -> dict[str, Any]:
    """Hit rate of reusable tokens and TTFT p50 over turns >= 2."""
    reusable = cached = 0
    ttfts = []
    for turns in per_conv:
        for previous, result in zip(turns, turns[1:], strict=False):
            if not (previous.ok and result.ok):
                continue
            could = (previous.prompt_tokens or 0) + previous.output_tokens
            reusable += could
            cached += min(result.cached_tokens or 0, could)
            if result.ttft_s is not None:
                ttfts.append(result.ttft_s)
    results = [r for turns in per_conv for r in turns]
    return {
        "turns": len(results),
        "errors": sum(not r.ok for r in results),
        "reusable_tokens": reusable,
        "cached_tokens": cached,
        "hit_rate": round(cached / reusable, 3) if reusable else None,
        "ttft_p50_turn2plus_s": summarize(ttfts).p50,
    }


def load_ratio(counts: list[int]) -> float | None:
    return round(max(counts) / min(counts), 2) if counts and min(counts) > 0 else None


class Cluster:
    """Replicas + router (router modes) or one multi-worker server; closed by close()."""

    def __init__(self, mode: str, replicas: int, base_port: int) -> None:
        self.mode = mode
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports = [base_port + 1 + i for i in range(replicas)]
        if mode.startswith("workers_"):
            routing = mode.removeprefix("workers_")
            self.procs.append(start_server(base_port, ["--workers", "2", "--routing", routing]))
        else:
            self.procs = [start_server(p, env=REPLICA_ENV) for p in self.ports]
            replica_flags = [f for p in self.ports for f in ("--replica", f"http://127.0.0.1:{p}")]
            self.procs.append(
                start_process(
                    [INFERFLUX, "router", "--port", str(base_port), *replica_flags],
                    f"http://127.0.0.1:{base_port}/readyz",
                    env={
                        "INFERFLUX_ROUTER__ROUTING": mode.removeprefix("router_"),
                        "INFERFLUX_ROUTER__HEALTH_INTERVAL_S": "0.5",
                    },
                )
            )
        self.url = f"http://127.0.0.1:{base_port}"

    def restart_replica(self, index: int) -> None:
        """kill -9 replica `index`, then start it again on its port (blocks until ready)."""
        kill_group(self.procs[index])
        self.procs[index] = start_server(self.ports[index], env=REPLICA_ENV)

    def served(self) -> list[int]:
        if self.mode.startswith("router_"):
            stats = httpx.get(f"{self.url}/router/stats", timeout=10).json()
            return [r["requests"] for r in stats["replicas"]]
        stats = httpx.get(f"{self.url}/server/stats", timeout=10).json()
        caches = [w.get("prefix_cache") or {} for w in stats["workers"]]
        return [c.get("hits", 0) + c.get("misses", 0) for c in caches]

    def close(self) -> None:
        for proc in self.procs:
            kill_group(proc)


async def _restart_midway(cluster: Cluster, total_turns: int, done: list[int]) -> None:
    while done[0] < total_turns // 2:
        await asyncio.sleep(0.2)
    await asyncio.to_thread(cluster.restart_replica, 1)


async def run_trace(
    cluster: Cluster, corpus: list[dict[str, Any]], max_tokens: int, restart: bool
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=600) as client:
        config = turn_config(cluster.url, await resolve_model(client), max_tokens)
        done = [0]

        async def count(request: httpx.Response) -> None:
            done[0] += 1

        client.event_hooks["response"].append(count)
        total = sum(len(c["turns"]) for c in corpus)
        restarter = asyncio.create_task(_restart_midway(cluster, total, done)) if restart else None
        per_conv, wall = await replay_turns(client, config, corpus)
        if restarter is not None:
            await restarter
    return {"wall_s": round(wall, 2), **trace_metrics(per_conv)}


def run_one(args: argparse.Namespace, scenario: str, mode: str) -> dict[str, Any]:
    if scenario == "restart" and mode.startswith("workers_"):
        return {"skipped": "a replica restart needs replicas"}
    corpus = scenario_corpus(scenario, args.conversations, args.turns, args.seed)
    try:
        cluster = Cluster(mode, args.replicas, args.port)
    except SystemExit as exc:  # e.g. a server without --routing
        return {"skipped": f"did not start: {exc}"}
    try:
        report = asyncio.run(run_trace(cluster, corpus, args.max_tokens, scenario == "restart"))
        served = cluster.served()
    finally:
        cluster.close()
    return {**report, "served": served, "load_ratio": load_ratio(served)}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "| scenario | mode | hit rate | TTFT p50 turns ≥ 2 (s) | load ratio | served | errors |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for scenario, modes in report["runs"].items():
        for mode, r in modes.items():
            if "skipped" in r:
                lines.append(f"| {scenario} | {mode} | – | – | – | – | {r['skipped']} |")
                continue
            ttft = r["ttft_p50_turn2plus_s"]
            lines.append(
                f"| {scenario} | {mode} | {r['hit_rate']} | "
                f"{round(ttft, 3) if ttft is not None else None} | {r['load_ratio']} | "
                f"{r['served']} | {r['errors']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--port", type=int, default=8096)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "conversations": args.conversations,
        "turns": args.turns,
        "replicas": args.replicas,
        "max_tokens": args.max_tokens,
        "runs": {},
    }
    for scenario in args.scenarios.split(","):
        report["runs"][scenario] = {}
        for mode in args.modes.split(","):
            result = run_one(args, scenario, mode)
            report["runs"][scenario][mode] = result
            print(scenario, mode, json.dumps(result))
    table = markdown(report)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
