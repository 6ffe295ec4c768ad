"""Request ids and the body-size limit (413 by Content-Length, and while streaming)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.fakes.engine import FakeEngineClient
from tests.openai_envelope import assert_envelope

LIMIT = 4096  # the unit app's server.max_request_bytes


async def test_request_id_is_generated(client: httpx.AsyncClient) -> None:
    first = (await client.get("/healthz")).headers["x-request-id"]
    second = (await client.get("/healthz")).headers["x-request-id"]
    assert len(first) == 32 and first != second


async def test_client_request_id_is_echoed(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz", headers={"x-request-id": "req-abc.123"})
    assert response.headers["x-request-id"] == "req-abc.123"


@pytest.mark.parametrize("bad", ["has space", "x" * 129, 'quote"d'])
async def test_malformed_client_request_id_is_replaced(client: httpx.AsyncClient, bad: str) -> None:
    response = await client.get("/healthz", headers={"x-request-id": bad})
    assert response.headers["x-request-id"] != bad


async def test_errors_carry_the_request_id(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", content=b"{", headers={"x-request-id": "r1"})
    assert response.status_code == 400 and response.headers["x-request-id"] == "r1"


async def test_body_over_limit_by_content_length_is_413(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = b'{"prompt": "' + b"x" * LIMIT + b'"}'
    response = await client.post("/v1/completions", content=body)
    error = assert_envelope(response, 413, code="request_too_large")
    assert str(LIMIT) in str(error["message"]) and "max_request_bytes" in str(error["message"])
    assert not engine.requests


async def test_streamed_body_over_limit_is_413(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    response = await client.post("/v1/completions", content=chunks())
    assert_envelope(response, 413, code="request_too_large")
    assert not engine.requests


async def test_body_at_limit_is_accepted(client: httpx.AsyncClient) -> None:
    prefix, suffix = b'{"prompt": "', b'", "max_tokens": 1}'
    body = prefix + b"x" * (LIMIT - len(prefix) - len(suffix)) + suffix
    assert len(body) == LIMIT
    response = await client.post("/v1/completions", content=body)
    # Accepted by the size limit; the prompt is then too long for the fake 256-token context.
    assert_envelope(response, 400, code="context_length_exceeded")
