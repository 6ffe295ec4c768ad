"""Speculative decoding, paired: every config's server up at once, requests
alternated between them one turn at a time.

`speculative.py --rounds N` runs a config's whole level before the next config starts, so
on a VM whose speed drifts by 30–45% within minutes (BENCHMARKS.md, ninth session) a
difference under about 25% cannot be read. Here every config serves the same prompt
within seconds of the others, the order rotating from prompt to prompt, so a drift slower
than one prompt's requests reaches every config alike. The servers that wait meanwhile
use almost no CPU (measured over 15 idle seconds after a request, SmolLM2: llama-server
0.0 CPU-seconds, an InferFlux server 0.16, about 1% of a core).

    INFERFLUX_COMPARE_CACHE=/work/cache-compare .venv/bin/python bench/spec_paired.py \\
        --models smollm2 --workloads edit,chat --rounds 3 \\
        --configs inferflux-off,inferflux-on,llama-server,llama-server-ngram-simple

Every round starts every server afresh, in an order and on ports rotated from round to
round (`--no-restart` keeps one set). The fourteenth session's A/A check (two servers of
the same config, kept up for three rounds) found them 4–6% apart in every round, always
the same one ahead: something fixed for a process's life (its start position, its port,
its memory layout) moves its speed by that much. Fresh servers each round turn that into
round-to-round spread, which the [min–max] shows and the mean averages out.

Every round puts a tag of its own before each prompt ("Request 2.3."), so no server
serves a prompt from the KV an earlier round left: llama-server keeps up to 8 GiB of
prompts in RAM (`--cache-ram`), InferFlux's prefix cache 8 sequences by default, and the
same twelve prompts sent again would measure their caches, not their decoding.

`--levels 1,4,8`: at a level c > 1 a turn sends c prompts at once to one config, then
the same c (each tagged apart, so none shares a cached prefix with another) to the next;
a workload's prompts are cycled until each has been sent at least once.

Per model, workload and level: each config's tok/s (completion tokens ÷ the wall time of
its own turns), and per round the ratio to `--reference` (default `inferflux-off`) over
the same prompts; the table gives the ratios' mean and [min–max] over the rounds.
Configs and workloads as in `speculative.py`. Results: bench/results/spec_paired.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from contextlib import ExitStack
from typing import Any

import httpx

from compare.models import MODELS, load_model
from compare.servers import Toolchain, running
from speculative import (
    LOGS,
    RESULTS,
    WORKLOADS,
    _client,
    _prompts,
    _server,
    add_config_args,
    resolve_configs,
    write_results,
)

Row = dict[str, Any]  # Any: JSON


def rotation(configs: list[str], turn: int) -> list[str]:
    """The order of the configs for the `turn`-th prompt: each goes first equally often."""
    k = turn % len(configs)
    return configs[k:] + configs[:k]


def fresh(prompt: str, round_: int, index: int) -> str:
    """`prompt` with a tag of its round in front: no earlier round's cached KV fits it."""
    return f"Request {round_ + 1}.{index + 1}. {prompt}"


def batches(count: int, level: int) -> list[list[int]]:
    """The prompt indices of each turn at concurrency `level` over `count` prompts: runs
    of `level`, cycling, until every prompt has been in one."""
    turns = -(-count // level)
    return [[(t * level + j) % count for j in range(level)] for t in range(turns)]


async def _one(url: str, prompts: list[str], max_tokens: int) -> tuple[int, int, int, float]:
    """`prompts` sent at once, one client each: (tokens, drafted, accepted, wall seconds)."""
    async with httpx.AsyncClient() as http:
        started = time.perf_counter()
        results = await asyncio.gather(*(_client(http, url, [p], max_tokens) for p in prompts))
        seconds = time.perf_counter() - started
    tokens, drafted, accepted = (sum(r[i] for r in results) for i in range(3))
    return tokens, drafted, accepted, seconds


def run_model(key: str, tools: Toolchain, args: Any) -> list[Row]:
    model = load_model(key)
    configs = [c for c in args.configs if tools.llama_server or not c.startswith("llama")]
    rows: list[Row] = []
    turn = 0
    servers: ExitStack | None = None
    urls: dict[str, str] = {}
    try:
        for round_ in range(args.rounds):
            if servers is None or args.restart_each_round:
                if servers is not None:
                    servers.close()
                servers = ExitStack()
                urls = _start(key, model, tools, args, rotation(configs, round_), servers)
            for workload, level in ((w, c) for w in args.workloads for c in args.levels):
                prompts = _prompts(workload)
                for index, batch in enumerate(batches(len(prompts), level)):
                    tagged = [
                        fresh(prompts[i], round_, index * level + j) for j, i in enumerate(batch)
                    ]
                    for config in rotation(configs, turn):
                        tokens, drafted, accepted, seconds = asyncio.run(
                            _one(urls[config], tagged, args.max_tokens)
                        )
                        row = {
                            "model": key,
                            "config": config,
                            "workload": workload,
                            "concurrency": level,
                            "prompt": index,
                            "round": round_,
                            "port": int(urls[config].rsplit(":", 1)[1]),
                            "tokens": tokens,
                            "seconds": round(seconds, 4),
                            "drafted": drafted,
                            "accepted": accepted,
                        }
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                    turn += 1
    finally:
        if servers is not None:
            servers.close()
    return rows


def _start(
    key: str, model: Any, tools: Toolchain, args: Any, order: list[str], stack: ExitStack
) -> dict[str, str]:
    """Start every config's server, in `order`, the i-th on port `args.port + i`, and warm
    each with one short request; their URLs by config."""
    urls = {}
    for i, config in enumerate(order):
        port = args.port + i
        server = _server(config, tools, model, port, args.draft_model, args.variants)
        log = LOGS / f"spec-paired-{key}-{config}.log"
        urls[config] = stack.enter_context(running(server, port, log)).url
    for url in urls.values():
        asyncio.run(_one(url, _prompts("chat")[:1], 4))
    return urls


def summarize(rows: list[Row], reference: str) -> list[Row]:
    """Per (model, workload, concurrency, config): tok/s over all rounds, and the
    per-round ratio of tok/s to `reference`'s over the same prompts."""
    out: list[Row] = []
    cells: dict[tuple[str, str, int, str], dict[int, list[Row]]] = {}
    for r in rows:
        level = r.get("concurrency", 1)
        cells.setdefault((r["model"], r["workload"], level, r["config"]), {}).setdefault(
            r["round"], []
        ).append(r)
    for (model, workload, level, config), rounds in cells.items():
        ref = cells.get((model, workload, level, reference), {})
        ratios = [_tok_s(mine) / _tok_s(ref[n]) for n, mine in sorted(rounds.items()) if ref.get(n)]
        every = [r for mine in rounds.values() for r in mine]
        out.append(
            {
                "model": model,
                "workload": workload,
                "concurrency": level,
                "config": config,
                "tokens": sum(r["tokens"] for r in every),
                "tok_s": round(_tok_s(every), 3),
                "drafted": sum(r["drafted"] for r in every),
                "accepted": sum(r["accepted"] for r in every),
                "ratios": [round(x, 4) for x in ratios],
            }
        )
    return out


def _tok_s(rows: list[Row]) -> float:
    return sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows)


def markdown(summary: list[Row], reference: str) -> str:
    lines = [
        f"| model | workload | c | config | tok/s | × {reference}, mean [min–max] of rounds "
        "| accepted / drafted | tokens |",
        "| --- | --- | ---: | --- | ---: | --- | --- | ---: |",
    ]
    for s in summary:
        ratios = s["ratios"]
        ratio = (
            f"{statistics.fmean(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}]"
            if ratios
            else "–"
        )
        lines.append(
            f"| {s['model']} | {s['workload']} | {s['concurrency']} | {s['config']} "
            f"| {s['tok_s']:.1f} | {ratio} "
            f"| {s['accepted']} / {s['drafted']} | {s['tokens']} |"
        )
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default="inferflux-off,inferflux-on,llama-server")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--reference", default="inferflux-off", help="the ratios' denominator")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--rounds", type=int, default=3, help="every prompt this many times")
    p.add_argument(
        "--levels",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[1],
        help="concurrency levels, comma-separated: c prompts at once per turn",
    )
    p.add_argument("--port", type=int, default=18451, help="the first server's; then +1 each")
    p.add_argument(
        "--no-restart",
        dest="restart_each_round",
        action="store_false",
        help="keep one set of servers for every round (the fourteenth session's A/A check "
        "found a 4-6%% gap between two identical servers kept up across rounds)",
    )
    p.add_argument("--out", default=str(RESULTS / "spec_paired"))
    add_config_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    tools = resolve_configs(args)
    if args.reference not in args.configs:
        raise SystemExit(f"--reference {args.reference} is not among --configs")
    rows = [row for key in args.models.split(",") for row in run_model(key, tools, args)]
    summary = summarize(rows, args.reference)
    payload = {"command": " ".join(sys.argv), "rows": rows, "summary": summary}
    write_results(args.out, payload, markdown(summary, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
