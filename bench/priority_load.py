"""Mixed-priority load and overload, against fresh servers started by this script.

1. Mixed priority (default settings): TTFT of high-priority chat requests alone, then
   while `--low-clients` low-priority streams saturate every sequence slot. Reports both
   TTFT distributions and the ratio of their p99 (target: <= 1.5).
2. Overload (`scheduler.high_watermark` 64, low 32): open-loop arrivals at `--overload`
   times the throughput measured in step 1, for `--seconds`. Reports status counts (only
   200, 503 and 408 are acceptable), 503 latency, and the RSS of the server and its worker
   sampled every second (memory must stay flat).

    .venv/bin/python bench/priority_load.py --json bench/results/priority_load.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from launch import start_server
from workload import make_prompts, summarize


def rss_mb(pid: int) -> float:
    """RSS of `pid` and its children (the engine worker), in MB."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    total = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


async def ttft(client: httpx.AsyncClient, prompt: str, priority: str, max_tokens: int) -> float:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "priority": priority,
    }
    started = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and '"content"' in line:
                first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


async def low_client(
    client: httpx.AsyncClient, prompts: list[str], stop: asyncio.Event, done: list[float]
) -> None:
    i = 0
    while not stop.is_set():
        body = {
            "prompt": prompts[i % len(prompts)],
            "max_tokens": 128,
            "temperature": 0,
            "ignore_eos": True,
            "priority": "low",
        }
        response = await client.post("/v1/completions", json=body)
        if response.status_code == 200:
            done.append(time.perf_counter())
        i += 1


async def mixed(url: str, low_clients: int, n_high: int) -> dict[str, Any]:
    high_prompts = make_prompts(n_high, 11, 10, 30)
    low_prompts = make_prompts(64, 12, 50, 150)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await ttft(client, "warm up", "high", 4)
        alone = [await ttft(client, p, "high", 16) for p in high_prompts]
        stop, done = asyncio.Event(), []
        lows = [
            asyncio.create_task(low_client(client, low_prompts[i::low_clients], stop, done))
            for i in range(low_clients)
        ]
        await asyncio.sleep(8)  # every slot busy, a queue behind them
        started = time.perf_counter()
        loaded = []
        for p in high_prompts:
            loaded.append(await ttft(client, p, "high", 16))
            await asyncio.sleep(0.5)
        elapsed = time.perf_counter() - started
        stats = (await client.get("/server/stats")).json()
        recent = (await client.get("/debug/requests")).json().get("recent", [])
        stop.set()
        for task in lows:
            task.cancel()
        await asyncio.gather(*lows, return_exceptions=True)
    completed_rate = len([t for t in done if t >= started]) / elapsed
    a, b = summarize(alone).as_dict(), summarize(loaded).as_dict()
    return {
        "high_ttft_alone": a,
        "high_ttft_loaded": b,
        "p99_ratio_loaded_over_alone": round(b["p99"] / a["p99"], 2),  # type: ignore[operator]
        "low_requests_per_s": round(completed_rate, 3),
        "fairness": stats["workers"][0]["fairness"],
        "slowest_high": _slowest_high(recent),
    }


def _slowest_high(recent: list[dict[str, Any]], n: int = 5) -> list[dict[str, Any]]:
    """Where the slowest high-priority requests spent their time (server side): in the
    worker's queue (no slot, or behind a step), in its steps up to the first token, or
    outside the worker (to it and back, the API process's queueing): `/debug/requests`."""
    high = [r for r in recent if r.get("priority") == "high" and r.get("time_to_first_token_s")]
    high.sort(key=lambda r: -r["time_to_first_token_s"])
    keys = (
        "queue_wait_s",
        "engine_prefill_s",
        "engine_time_to_first_token_s",
        "time_to_first_token_s",
        "num_prompt_tokens",
        "num_cached_tokens",
    )
    return [{k: r.get(k) for k in keys} for r in high[:n]]


async def overload(url: str, pid: int, rate: float, seconds: float) -> dict[str, Any]:
    prompts = make_prompts(256, 13, 50, 150)
    statuses: Counter[int] = Counter()
    fast_503: list[float] = []
    rss: list[float] = []

    async def one(prompt: str) -> None:
        started = time.perf_counter()
        body = {"prompt": prompt, "max_tokens": 128, "temperature": 0, "ignore_eos": True}
        try:
            response = await client.post("/v1/completions", json=body)
            statuses[response.status_code] += 1
            if response.status_code == 503:
                fast_503.append(time.perf_counter() - started)
        except httpx.HTTPError as exc:
            statuses[-1] += 1
            print("transport error:", type(exc).__name__)

    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=2000)
    ) as client:
        tasks = []
        started = time.perf_counter()
        i = 0
        while time.perf_counter() - started < seconds:
            tasks.append(asyncio.create_task(one(prompts[i % len(prompts)])))
            i += 1
            if i % max(1, int(rate)) == 0:
                rss.append(rss_mb(pid))
            await asyncio.sleep(1.0 / rate)
        await asyncio.gather(*tasks)
        rss.append(rss_mb(pid))
    return {
        "offered": i,
        "offered_per_s": round(rate, 2),
        "statuses": dict(statuses),
        "latency_503": summarize(fast_503).as_dict(),
        "rss_mb_first_last_max": [round(rss[0], 1), round(rss[-1], 1), round(max(rss), 1)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=8094)
    parser.add_argument("--low-clients", type=int, default=24)
    parser.add_argument("--high-requests", type=int, default=12)
    parser.add_argument("--overload", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--parts", default="mixed,overload")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}"
    report: dict[str, Any] = {}
    parts = set(args.parts.split(","))
    if "mixed" in parts:
        server = start_server(args.port, env={"INFERFLUX_OBSERVABILITY__DEBUG_HISTORY": "1000"})
        try:
            report["mixed"] = asyncio.run(mixed(url, args.low_clients, args.high_requests))
        finally:
            server.terminate()
            server.wait(30)
        print(json.dumps(report["mixed"], indent=1))
    if "overload" in parts:
        low_rate = report["mixed"]["low_requests_per_s"] if "mixed" in report else 1.0
        rate = args.overload * max(low_rate, 0.1)
        env = {
            "INFERFLUX_SCHEDULER__HIGH_WATERMARK": "64",
            "INFERFLUX_SCHEDULER__LOW_WATERMARK": "32",
        }
        server = start_server(args.port, env=env)
        try:
            report["overload"] = asyncio.run(overload(url, server.pid, rate, args.seconds))
        finally:
            server.terminate()
            server.wait(30)
        print(json.dumps(report["overload"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
