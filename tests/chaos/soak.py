"""The soak: `soak_requests` mixed requests (streams, non-streams, cancels, structured
output, embeddings, Ollama chat) from `streams` clients on one `inferflux serve --workers 2`.
Targets: 0 lost or interleaved streams, 0 500s, RSS growth < 5 MB per 10k requests after
warm-up (the API process and its workers), and no file-descriptor or thread growth."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, Outcome, send_one, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving, workers

WARMUP_FRACTION = 0.1
MIN_JUDGED = 2000  # fewer requests after warm-up: an RSS slope per 10k is noise
RSS_TARGET_MB_PER_10K = 5.0
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def _proc(pid: int) -> tuple[float, int, int]:
    """(RSS MB, open fds, threads) of `pid`."""
    rss_mb, threads = 0.0, 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_mb = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss_mb, len(list(Path(f"/proc/{pid}/fd").iterdir())), threads


def _sample(url: str, api_pid: int) -> dict[str, float]:
    rss, fds, threads = _proc(api_pid)
    worker_rss = sum(_proc(int(w["pid"]))[0] for w in workers(url))
    return {"api_rss_mb": rss, "fds": fds, "threads": threads, "worker_rss_mb": worker_rss}


async def _cancel(client: httpx.AsyncClient, number: int) -> Outcome:
    """A stream the client abandons after its first event (counts ok when it started)."""
    body = {
        "messages": [{"role": "user", "content": f"Tell me a long story #{number}"}],
        "max_tokens": 64, "stream": True, "ignore_eos": True,
    }  # fmt: skip
    outcome = Outcome(time.monotonic())
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            outcome.status = response.status_code
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    break
    except httpx.HTTPError as exc:
        outcome.kind, outcome.detail = "lost", f"cancel: {type(exc).__name__}"
    if outcome.status != 200:
        outcome.kind = "failed"
    outcome.ended_at = time.monotonic()
    return outcome


async def _plain(client: httpx.AsyncClient, path: str, body: dict[str, object]) -> Outcome:
    outcome = Outcome(time.monotonic())
    try:
        response = await client.post(path, json=body)
        outcome.status = response.status_code
        if response.status_code != 200:
            outcome.kind, outcome.detail = "failed", f"{path} {response.status_code}"
        elif path == "/v1/chat/completions" and "response_format" in body:
            choice = response.json()["choices"][0]
            if choice["finish_reason"] == "stop":  # "length": cut short, valid so far
                json.loads(choice["message"]["content"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        outcome.kind, outcome.detail = "lost", f"{path}: {type(exc).__name__}: {exc}"[:160]
    outcome.ended_at = time.monotonic()
    return outcome


async def _one(client: httpx.AsyncClient, number: int, model: str) -> Outcome:
    kind = number % 8
    if kind in (0, 1, 2):
        return await send_one(client, LoadSpec(max_tokens=16), number)
    if kind == 3:
        return await send_one(client, LoadSpec(max_tokens=16, stream=False), number)
    if kind == 4:
        return await _cancel(client, number)
    if kind == 5:
        body = {
            "messages": [{"role": "user", "content": f"A person, as JSON #{number}"}],
            "max_tokens": 128,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": SCHEMA},
            },
        }
        return await _plain(client, "/v1/chat/completions", body)
    if kind == 6:
        return await _plain(client, "/v1/embeddings", {"input": [f"soak text {number}"]})
    body = {
        "model": model, "messages": [{"role": "user", "content": f"Say hi #{number}"}],
        "stream": False, "options": {"num_predict": 8},
    }  # fmt: skip
    return await _plain(client, "/api/chat", body)


async def _soak(url: str, total: int, concurrency: int, on_warm: object) -> list[Outcome]:
    outcomes: list[Outcome] = []
    counter = iter(range(total))
    warm_at = int(total * WARMUP_FRACTION)

    async def client_loop(client: httpx.AsyncClient) -> None:
        for number in counter:
            outcomes.append(await _one(client, number, model))
            if len(outcomes) == warm_at:
                on_warm()  # type: ignore[operator]

    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return outcomes


def soak(run: ChaosRun) -> list[FaultResult]:
    total = run.soak_requests
    result = FaultResult(
        f"soak: {total} mixed requests, {run.streams} clients",
        target=f"0 lost/interleaved, 0 500s; RSS growth < {RSS_TARGET_MB_PER_10K:g} MB per 10k "
        "after warm-up; no fd or thread growth",
        passed=True,
    )
    started = time.monotonic()
    with serving(run.log_dir, "soak", "--workers", "2", num_workers=2) as server:
        samples: list[dict[str, float]] = []
        outcomes = asyncio.run(
            _soak(
                server.url,
                total,
                run.streams,
                lambda: samples.append(_sample(server.url, server.process.pid)),
            )
        )
        time.sleep(2)  # let the last cancels' aborts land
        samples.append(_sample(server.url, server.process.pid))
    result.count(tally(outcomes))
    result.duration_s = time.monotonic() - started
    if len(samples) < 2:
        result.check(False, "warm-up sample taken")
        return [result]
    warm, end = samples[0], samples[-1]
    after_warm = total - int(total * WARMUP_FRACTION)
    per_10k = {
        key: (end[key] - warm[key]) * 10_000 / max(after_warm, 1)
        for key in ("api_rss_mb", "worker_rss_mb")
    }
    result.notes.append(f"after warm-up: {warm}; at the end: {end}")
    result.notes.append(
        f"RSS growth per 10k requests: API {per_10k['api_rss_mb']:.1f} MB, workers "
        f"{per_10k['worker_rss_mb']:.1f} MB; {total / result.duration_s:.1f} requests/s"
    )
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    if after_warm >= MIN_JUDGED:
        result.check(per_10k["api_rss_mb"] < RSS_TARGET_MB_PER_10K, "API RSS growth")
        result.check(per_10k["worker_rss_mb"] < RSS_TARGET_MB_PER_10K, "workers' RSS growth")
    else:
        result.notes.append(f"RSS growth not judged: under {MIN_JUDGED} requests after warm-up")
    result.check(end["fds"] <= warm["fds"] + 4, "no fd growth")
    result.check(end["threads"] <= warm["threads"] + 2, "no thread growth")
    return [result]
