"""The soak: `soak_requests` mixed requests (streams, non-streams, cancels, structured
output, embeddings, Ollama chat) from `streams` clients on one `inferflux serve --workers 2`.
Targets: 0 lost or interleaved streams, 0 500s, RSS growth < 5 MB per 10k requests after
warm-up (each process: the API process and each worker), and no file-descriptor or thread
growth.

RSS is sampled `SAMPLES` times after the warm-up, and the growth per 10k requests is the
least-squares slope of each process's RSS over the requests done: two samples alone
(warm-up and end) make the figure hostage to whatever the allocator held at either moment.
The slope over the second half is reported too: a bounded cache that fills (token pieces,
compiled grammars) flattens there, a leak does not."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, Outcome, send_one, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving, workers

WARMUP_FRACTION = 0.1
SAMPLES = 20  # RSS samples after the warm-up
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


def _sample(url: str, api_pid: int, done: int) -> dict[str, float]:
    """RSS (MB) of the API process (`api`) and of each worker (`worker <pid>`), the API
    process's fds and threads, after `done` requests."""
    rss, fds, threads = _proc(api_pid)
    sample = {"done": float(done), "api": rss, "fds": float(fds), "threads": float(threads)}
    for worker in workers(url):
        sample[f"worker {worker['pid']}"] = _proc(int(worker["pid"]))[0]
    return sample


def _slope_per_10k(points: list[tuple[float, float]]) -> float:
    """Least-squares MB per 10k requests of (requests done, RSS MB) points."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return cov / var * 10_000 if var > 0 else 0.0


def rss_growth(samples: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Per process seen in every sample: (slope per 10k over all samples, over the
    second half)."""
    processes = [k for k in samples[0] if k == "api" or k.startswith("worker ")]
    growth = {}
    for key in processes:
        if not all(key in s for s in samples):
            continue  # a worker replaced during the soak: not comparable
        points = [(s["done"], s[key]) for s in samples]
        growth[key] = (_slope_per_10k(points), _slope_per_10k(points[len(points) // 2 :]))
    return growth


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


async def _soak(
    url: str, total: int, concurrency: int, on_sample: Callable[[int], None]
) -> list[Outcome]:
    """Every outcome; `on_sample(done)` at the end of the warm-up and SAMPLES - 1 times
    evenly after it."""
    outcomes: list[Outcome] = []
    counter = iter(range(total))
    warm_at = int(total * WARMUP_FRACTION)
    every = max(1, (total - warm_at) // SAMPLES)

    async def client_loop(client: httpx.AsyncClient) -> None:
        for number in counter:
            outcomes.append(await _one(client, number, model))
            done = len(outcomes)
            if done >= warm_at and (done - warm_at) % every == 0 and done < total:
                on_sample(done)

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

        def on_sample(done: int) -> None:
            samples.append(_sample(server.url, server.process.pid, done))

        outcomes = asyncio.run(_soak(server.url, total, run.streams, on_sample))
        time.sleep(2)  # let the last cancels' aborts land
        on_sample(len(outcomes))
    result.count(tally(outcomes))
    result.duration_s = time.monotonic() - started
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    if len(samples) < 2:
        result.check(False, "warm-up sample taken")
        return [result]
    _judge_growth(result, samples, total)
    return [result]


def _judge_growth(result: FaultResult, samples: list[dict[str, float]], total: int) -> None:
    warm, end = samples[0], samples[-1]
    growth = rss_growth(samples)
    result.notes.append(f"after warm-up: {warm}; at the end: {end}")
    result.notes.append(
        "RSS growth per 10k requests (least-squares over "
        f"{len(samples)} samples; second half in brackets): "
        + ", ".join(f"{k} {g:.1f} MB ({h:.1f})" for k, (g, h) in growth.items())
        + f"; {total / result.duration_s:.1f} requests/s"
    )
    if end["done"] - warm["done"] >= MIN_JUDGED:
        for key, (slope, _) in growth.items():
            result.check(slope < RSS_TARGET_MB_PER_10K, f"RSS growth of {key}")
    else:
        result.notes.append(f"RSS growth not judged: under {MIN_JUDGED} requests after warm-up")
    result.check(end["fds"] <= warm["fds"] + 4, "no fd growth")
    result.check(end["threads"] <= warm["threads"] + 2, "no thread growth")
