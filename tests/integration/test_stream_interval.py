"""`scheduler.stream_interval` on the real engine: a stream in chunks of N tokens says
exactly what the same greedy request says unstreamed, with every logprob, and its first
token still comes alone."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inferflux.config.loader import load_settings
from tests.integration.inprocess_app import running_app

INTERVAL = 4
MAX_TOKENS = 17


@pytest.fixture(scope="module")
async def chunked_app() -> AsyncIterator[FastAPI]:
    overrides = {"runtime.in_process": True, "scheduler.stream_interval": INTERVAL}
    async with running_app(load_settings(env={}, overrides=overrides)) as app:
        yield app


@pytest.fixture
async def client(chunked_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=chunked_app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://inferflux", timeout=120
    ) as client:
        yield client


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


async def _stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: ") :]))
    return chunks


async def test_chunks_of_interval_tokens_say_what_the_unstreamed_answer_says(
    client: httpx.AsyncClient,
) -> None:
    whole = (await client.post("/v1/chat/completions", json=_body())).json()
    assert whole["usage"]["completion_tokens"] == MAX_TOKENS
    chunks = await _stream(client, _body(stream=True, stream_options={"include_usage": True}))
    pieces = [
        c["choices"][0]["delta"]["content"]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("content")
    ]
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]
    # the first token alone, then at most one event per INTERVAL tokens
    assert 2 <= len(pieces) <= 1 + math.ceil((MAX_TOKENS - 1) / INTERVAL)
    assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS


async def test_every_token_keeps_its_logprob_in_merged_chunks(client: httpx.AsyncClient) -> None:
    chunks = await _stream(client, _body(stream=True, logprobs=True, top_logprobs=2))
    entries = [
        entry
        for c in chunks
        if c["choices"] and c["choices"][0].get("logprobs")
        for entry in c["choices"][0]["logprobs"]["content"]
    ]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert len(entries) == MAX_TOKENS
    assert all(len(entry["top_logprobs"]) == 2 for entry in entries)
    assert "".join(entry["token"] for entry in entries) == text
