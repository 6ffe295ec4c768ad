"""Graceful shutdown's logic (api/drain.py): the drain sequence over fake generations,
and the app answering 503 `shutting_down` while draining (over the fake engine)."""

from __future__ import annotations

import asyncio
import time

import httpx
from fastapi import FastAPI

from inferflux.api.drain import STOP_RESERVE_S, Drain, drain_then_stop
from inferflux.api.state import app_state
from tests.openai_envelope import assert_envelope


class FakeGeneration:
    """Stands in for `Generation`: records that the drain cut it."""

    def __init__(self) -> None:
        self.aborted = False

    async def abort(self) -> None:
        self.aborted = True


async def test_nothing_open_stops_at_once_and_cuts_nothing() -> None:
    drain, stopped, generation = Drain(), [], FakeGeneration()
    drain.track(generation)
    started = time.monotonic()
    await drain_then_stop(drain, 5.0, lambda: stopped.append(time.monotonic()))
    assert drain.draining and not drain.cut and not generation.aborted
    assert stopped and stopped[0] - started < 0.5


async def test_a_request_that_ends_within_the_grace_is_not_cut() -> None:
    drain, stopped, generation = Drain(), [], FakeGeneration()
    drain.track(generation)
    drain.opened()
    asyncio.get_running_loop().call_later(0.2, drain.closed)
    await drain_then_stop(drain, 5.0, lambda: stopped.append(True))
    assert stopped == [True] and not drain.cut and not generation.aborted


async def test_requests_still_open_are_cut_before_the_grace_ends() -> None:
    drain, stopped, generation = Drain(), [], FakeGeneration()
    drain.track(generation)
    drain.opened()  # never closes: the cut, then the flush time, then stop
    grace_s = 1.2
    started = time.monotonic()
    await drain_then_stop(drain, grace_s, lambda: stopped.append(time.monotonic()))
    assert drain.cut and generation.aborted
    elapsed = stopped[0] - started
    assert grace_s - min(STOP_RESERVE_S, grace_s / 2) <= elapsed < grace_s + 0.5


async def test_a_draining_app_refuses_new_requests_in_each_dialects_shape(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    app_state(app).generation.drain.begin()
    assert_envelope(await client.get("/readyz"), 503, code="shutting_down")
    assert (await client.get("/livez")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    refused = await client.post("/v1/chat/completions", json=body)
    assert_envelope(refused, 503, code="shutting_down")
    assert refused.headers["retry-after"] == "1"
    ollama = await client.post("/api/chat", json=body)
    assert ollama.status_code == 503 and "shutting down" in ollama.json()["error"]
    assert (await client.get("/v1/models")).status_code == 503
