"""The stall-free batching trade-off: ITL p99 against TTFT and tokens/s per `itl_target_ms`.

For each setting of `scheduler.itl_target_ms` (0 = off), a fresh `inferflux serve` runs the
same load: `--concurrency` streaming clients, each sending `--requests` chat requests one
after another, with long prompts (`--min-words`..`--max-words`), so new prompts are
admitted while other streams decode (the case where one long prefill step stalls every
stream). Settings are run in alternated order over `--rounds` rounds, so a drift of the
machine hits all of them alike; the report gives per setting the median over rounds of
output tok/s, TTFT p50/p99 and ITL p50/p99.

    .venv/bin/python bench/itl_tradeoff.py --json bench/results/itl_tradeoff_smollm2.json
    .venv/bin/python bench/itl_tradeoff.py --model gemma --targets 0,300,150,75
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from launch import kill_group, model_args, start_server
from serve_load import (
    LoadConfig,
    format_table,
    make_http_client,
    resolve_model,
    run_level,
    stream_one,
)
from workload import make_prompts

_PORT = 18431


async def _one_setting(
    config: LoadConfig, concurrency: int, warmup: int, finish: Finish | None
) -> dict[str, Any]:
    async with make_http_client(config, concurrency) as client:
        config = replace(config, model=await resolve_model(client))
        for prompt in make_prompts(warmup, config.seed + 1, 8, 16):
            await stream_one(client, config, prompt)
        level = await run_level(client, config, concurrency)
        if finish is not None:
            await finish(client, level)
        return level


# reads more of the server into a level's report before it stops (bench/disaggregated.py)
Finish = Callable[[httpx.AsyncClient, dict[str, Any]], Awaitable[None]]


def run_setting(
    port: int, args: argparse.Namespace, env: dict[str, str], finish: Finish | None = None
) -> dict[str, Any]:
    """A fresh `inferflux serve` with `env` on `port` under the load `args` describe
    (--model, --concurrency, --requests, --max-tokens, --min/max-words, --warmup, --seed):
    the level's report without its per-request rows."""
    server: subprocess.Popen[bytes] = start_server(port, model_args(args.model), env)
    try:
        config = LoadConfig(
            url=f"http://127.0.0.1:{port}",
            model="",
            endpoint="chat",
            max_tokens=args.max_tokens,
            requests_per_client=args.requests,
            seed=args.seed,
            min_words=args.min_words,
            max_words=args.max_words,
        )
        level = asyncio.run(_one_setting(config, args.concurrency, args.warmup, finish))
    finally:
        kill_group(server)
    level.pop("requests")
    return level


def _run(target_ms: float, args: argparse.Namespace) -> dict[str, Any]:
    level = run_setting(_PORT, args, {"INFERFLUX_SCHEDULER__ITL_TARGET_MS": str(target_ms)})
    level["itl_target_ms"] = target_ms
    print(f"itl_target_ms={target_ms:g}\n" + format_table([level]), flush=True)
    return level


def median_of(levels: list[dict[str, Any]], key: str, stat: str | None) -> float:
    values = [lv[key][stat] if stat else lv[key] for lv in levels]
    return statistics.median(values)


def summarize_settings(runs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per setting, the median over rounds of each figure (times in ms)."""
    rows = []
    for target in sorted({r["itl_target_ms"] for r in runs}):
        levels = [r for r in runs if r["itl_target_ms"] == target]
        rows.append({"itl_target_ms": target} | latency_row(levels))
    return rows


def latency_row(levels: list[dict[str, Any]]) -> dict[str, float]:
    """One setting's rounds: errors, and the median over rounds of output tok/s, TTFT
    and ITL p50/p99 (ms)."""
    return {
        "rounds": len(levels),
        "errors": sum(lv["num_errors"] for lv in levels),
        "output_tok_s": median_of(levels, "output_tok_s", None),
        "ttft_p50_ms": 1000 * median_of(levels, "ttft_s", "p50"),
        "ttft_p99_ms": 1000 * median_of(levels, "ttft_s", "p99"),
        "itl_p50_ms": 1000 * median_of(levels, "itl_s", "p50"),
        "itl_p99_ms": 1000 * median_of(levels, "itl_s", "p99"),
    }


def markdown(rows: list[dict[str, float]]) -> str:
    lines = [
        "| itl_target_ms | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
        "| errors |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        target = "off" if r["itl_target_ms"] == 0 else f"{r['itl_target_ms']:g}"
        lines.append(
            f"| {target} | {r['output_tok_s']:.1f} | {r['ttft_p50_ms']:.0f} "
            f"| {r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.0f} | {r['itl_p99_ms']:.0f} "
            f"| {r['errors']:.0f} |"
        )
    return "\n".join(lines)


def load_arguments(p: argparse.ArgumentParser, **defaults: Any) -> argparse.ArgumentParser:
    """The load and report options `run_setting` and `run_rounds` read (`defaults` set
    concurrency, max_tokens, min_words, max_words, seed)."""
    p.add_argument("--model", default="smollm2", help="smollm2, gemma, or a GGUF path")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=defaults.get("concurrency", 8))
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=defaults.get("max_tokens", 64))
    p.add_argument("--min-words", type=int, default=defaults.get("min_words", 150))
    p.add_argument("--max-words", type=int, default=defaults.get("max_words", 400))
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=defaults.get("seed", 21))
    p.add_argument("--json", type=Path, default=None)
    return p


def run_rounds(
    settings: list[Any], args: argparse.Namespace, run: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`run` each setting once per round, in alternated order (a drift of the machine then
    hits every setting alike)."""
    runs: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        order = settings if round_index % 2 == 0 else list(reversed(settings))
        runs.extend(run(setting) for setting in order)
    return runs


def report(
    args: argparse.Namespace, rows: list[dict[str, Any]], runs: list[dict[str, Any]], table: str
) -> int:
    """Print the table, write the JSON report (--json); exit status 1 if any request failed."""
    print("\n" + table)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"args": vars(args) | {"json": str(args.json)}, "settings": rows, "runs": runs}
        args.json.write_text(json.dumps(body, indent=2, default=str) + "\n", encoding="utf-8")
    return 1 if any(r["errors"] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default="0,300,150,75", help="itl_target_ms values, 0 = off")
    args = load_arguments(p).parse_args(argv)
    targets = [float(t) for t in args.targets.split(",")]
    runs = run_rounds(targets, args, lambda target: _run(target, args))
    rows = summarize_settings(runs)
    return report(args, rows, runs, markdown(rows))


if __name__ == "__main__":
    raise SystemExit(main())
