"""Server vs engine ceiling, side by side in one run: what HTTP + IPC + SSE cost.

Starts a real `inferflux serve` (worker process, default settings unless --config), and
an in-process EngineCore with the same settings. For each concurrency level it runs the
engine workload (bench/engine_limit.py) and then the same prompts over HTTP
(bench/serve_load.py), so both see the same machine state. Each side gets the CPU
alone: the idle server's worker blocks on its socket while the engine runs, and the
engine is idle while the server runs. Prints both tables and the ratio server / engine
of aggregate output tok/s per level, and optionally writes JSON and a markdown table.

Usage:
    .venv/bin/python bench/server_vs_engine.py                         # levels 1,4,8,16
    .venv/bin/python bench/server_vs_engine.py --model PATH --concurrency 1,8 --requests 4
    .venv/bin/python bench/server_vs_engine.py --json bench/results/x.json --markdown out.md
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from engine_limit import load_engine, tokenize_prompts
from engine_limit import run_level as engine_run_level
from launch import start_server
from serve_load import LoadConfig, format_table, level_report, make_http_client, parse_levels
from serve_load import run_level as server_run_level
from workload import make_prompts


def server_args(model: str | None, config: str | None) -> list[str]:
    return [*(["--model", model] if model else []), *(["--config", config] if config else [])]


async def server_level(config: LoadConfig, concurrency: int) -> dict[str, Any]:
    async with make_http_client(config, concurrency) as client:
        return await server_run_level(client, config, concurrency)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--config", default=None)
    p.add_argument("--port", type=int, default=18181)
    p.add_argument("--concurrency", type=parse_levels, default=[1, 4, 8, 16])
    p.add_argument("--requests", type=int, default=6, help="requests per client (>= 6: stable)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args(argv)

    info, tokenizer, core = load_engine(args.model, args.config)
    config = LoadConfig(
        url=f"http://127.0.0.1:{args.port}",
        model=info.model_id,
        endpoint="chat",
        max_tokens=args.max_tokens,
        requests_per_client=args.requests,
        seed=args.seed,
        min_words=16,
        max_words=128,
    )
    server = start_server(args.port, server_args(args.model, args.config))
    engine_levels: list[dict[str, Any]] = []
    server_levels: list[dict[str, Any]] = []
    try:
        warm = tokenize_prompts(tokenizer, info.architecture, make_prompts(2, args.seed + 1, 8, 16))
        engine_run_level(core, warm, 1, 8)
        asyncio.run(server_level(dataclasses.replace(config, max_tokens=8), 1))
        for concurrency in args.concurrency:
            texts = make_prompts(concurrency * args.requests, args.seed, 16, 128)
            prompts = tokenize_prompts(tokenizer, info.architecture, texts)
            results, wall_s = engine_run_level(core, prompts, concurrency, args.max_tokens)
            engine_levels.append(level_report(concurrency, results, wall_s, config))
            server_levels.append(asyncio.run(server_level(config, concurrency)))
            ratio = server_levels[-1]["output_tok_s"] / engine_levels[-1]["output_tok_s"]
            print(f"concurrency {concurrency}: server/engine = {ratio:.3f}", flush=True)
    finally:
        server.terminate()
        server.wait(30)
        core.close()
    report(info.model_id, engine_levels, server_levels, args)
    return 0


def report(
    model_id: str, engine: list[dict[str, Any]], server: list[dict[str, Any]], args: Any
) -> None:  # Any: argparse namespace
    print("\nengine (no HTTP):\n" + format_table(engine))
    print("\nserver (HTTP + IPC + SSE):\n" + format_table(server))
    rows = [
        "| concurrency | engine tok/s | server tok/s | server / engine |",
        "| --- | --- | --- | --- |",
    ]
    for e, s in zip(engine, server, strict=True):
        ratio = s["output_tok_s"] / e["output_tok_s"]
        cells = [str(e["concurrency"]), f"{e['output_tok_s']:.1f}", f"{s['output_tok_s']:.1f}"]
        rows.append("| " + " | ".join([*cells, f"{ratio:.2f}"]) + " |")
    c1 = next((s for s in server if s["concurrency"] == 1), None)
    c16 = next((s for s in server if s["concurrency"] == 16), None)
    if c1 and c16:
        scaling = c16["output_tok_s"] / c1["output_tok_s"]
        rows.append(f"\nserver aggregate tok/s, concurrency 16 / 1: {scaling:.2f}")
    table = f"model {model_id}\n\n" + "\n".join(rows)
    print("\n" + table)
    if args.markdown is not None:
        args.markdown.write_text(table + "\n", encoding="utf-8")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"model": model_id, "engine": engine, "server": server}
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
