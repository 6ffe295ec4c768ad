"""What `inferflux router` costs: added latency per request and CPU per streamed token.

One replica (`inferflux serve`, one thread) and a router in front of it. Latency: the
same small non-streaming chat request (max_tokens 1) sent N times straight to the
replica and N times through the router, alternating, one at a time; reported as p50/p99
of each and the difference. CPU: the router process's CPU time (user + system, from
/proc) while it relays S concurrent streams of T tokens each (ignore_eos), less its idle
rate (health polling, measured for 3 s before), divided by the tokens relayed
(usage.completion_tokens).

    .venv/bin/python bench/router_overhead.py --json bench/results/router_overhead.json
    .venv/bin/python bench/router_overhead.py --requests 20 --streams 2 --tokens 16  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from launch import INFERFLUX, kill_group, start_process, start_server
from serve_load import LoadConfig, resolve_model, stream_one
from workload import summarize

IDLE_S = 3.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def latencies(direct: str, routed: str, n: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"direct": [], "router": []}
    async with httpx.AsyncClient(timeout=120) as client:
        models = (await client.get(f"{direct}/v1/models")).json()
        model = models["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Say yes."}],
            "max_tokens": 1,
            "temperature": 0,
        }
        for i in range(n + 2):  # two warm-up rounds, not counted
            for name, url in (("direct", direct), ("router", routed)):
                started = time.perf_counter()
                answer = await client.post(f"{url}/v1/chat/completions", json=body)
                answer.raise_for_status()
                if i >= 2:
                    times[name].append(time.perf_counter() - started)
    direct_s, router_s = summarize(times["direct"]), summarize(times["router"])
    return {
        "direct": direct_s.as_dict(),
        "router": router_s.as_dict(),
        "added_p50_ms": round(((router_s.p50 or 0) - (direct_s.p50 or 0)) * 1000, 3),
        "added_p99_ms": round(((router_s.p99 or 0) - (direct_s.p99 or 0)) * 1000, 3),
    }


async def stream_cpu(routed: str, router_pid: int, streams: int, tokens: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=routed, timeout=600) as client:
        model = await resolve_model(client)
        config = LoadConfig(routed, model, "chat", tokens, 1, 0, 1, 1, ignore_eos=True)
        idle_before = cpu_s(router_pid)  # the idle cost (health polling), subtracted below
        await asyncio.sleep(IDLE_S)
        idle_rate = (cpu_s(router_pid) - idle_before) / IDLE_S
        before = cpu_s(router_pid)
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                stream_one(client, config, f"Story number {i}: once upon a time")
                for i in range(streams)
            )
        )
        wall = time.perf_counter() - started
        used = cpu_s(router_pid) - before - idle_rate * (time.perf_counter() - started)
    relayed = sum(r.output_tokens for r in results if r.ok)
    return {
        "streams": streams,
        "tokens_relayed": relayed,
        "errors": [r.error for r in results if not r.ok],
        "router_cpu_s": round(used, 3),
        "router_idle_cpu_per_s": round(idle_rate, 4),
        "wall_s": round(wall, 2),
        "router_cpu_us_per_token": round(used / relayed * 1e6, 1) if relayed else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--port", type=int, default=8094)
    parser.add_argument("--router-port", type=int, default=8095)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    direct = f"http://127.0.0.1:{args.port}"
    routed = f"http://127.0.0.1:{args.router_port}"
    replica = start_server(args.port, env={"INFERFLUX_RUNTIME__N_THREADS": "1"})
    argv_router = [INFERFLUX, "router", "--port", str(args.router_port), "--replica", direct]
    router = start_process(argv_router, f"{routed}/readyz")
    try:
        report = {
            "latency": asyncio.run(latencies(direct, routed, args.requests)),
            "stream_cpu": asyncio.run(stream_cpu(routed, router.pid, args.streams, args.tokens)),
        }
    finally:
        kill_group(router)
        kill_group(replica)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
