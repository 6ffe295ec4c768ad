"""Backpressure (503 + Retry-After above the high watermark) and queue timeouts (408) on a
real server: one sequence slot, so a long stream keeps every other request queued."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.server_process import serving

pytestmark = [pytest.mark.model, pytest.mark.server]

ENV = {
    "INFERFLUX_SCHEDULER__MAX_NUM_SEQS": "1",
    "INFERFLUX_SCHEDULER__HIGH_WATERMARK": "3",
    "INFERFLUX_SCHEDULER__LOW_WATERMARK": "1",
    "INFERFLUX_SCHEDULER__QUEUE_TIMEOUT_S": "2",
    "INFERFLUX_SCHEDULER__PREFIX_CACHE__SLOTS": "1",
    "INFERFLUX_MODEL__CTX_SIZE": "1024",
}


@pytest.fixture(scope="module")
def one_slot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("backpressure") / "server.log"
    with serving(ENV, log) as url:
        yield url


def completion(max_tokens: int) -> dict[str, object]:
    return {"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True}


async def test_overload_gets_503_then_queued_requests_time_out_with_408(
    one_slot_server: str,
) -> None:
    async with httpx.AsyncClient(base_url=one_slot_server, timeout=60) as client:
        stream_ctx = client.stream(
            "POST", "/v1/completions", json={**completion(600), "stream": True}
        )
        stream = await stream_ctx.__aenter__()
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        await anext(lines)  # the stream runs: it holds the only slot

        async def one() -> httpx.Response:
            return await client.post("/v1/completions", json=completion(8))

        tasks = []
        for _ in range(6):  # submitted one after another so depths are deterministic
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(0.15)
        responses = await asyncio.gather(*tasks)
        statuses = sorted(r.status_code for r in responses)
        # depth 0, 1, 2 queue; at depth 3 backpressure starts and stays on above 1
        assert statuses == [408, 408, 408, 503, 503, 503], statuses
        for response in responses:
            body = response.json()
            assert set(body["error"]) >= {"message", "type", "code"}
            assert int(response.headers["retry-after"]) >= 1
            if response.status_code == 503:
                assert body["error"]["code"] == "queue_full"
            else:
                assert body["error"]["code"] == "queue_timeout"
                assert response.headers["connection"] == "close"
        await stream_ctx.__aexit__(None, None, None)  # frees the slot

        # the queue drained below the low watermark: admission resumes
        ok = await client.post("/v1/completions", json=completion(4))
        assert ok.status_code == 200, ok.text
        stats = (await client.get("/server/stats")).json()
        (worker,) = stats["workers"]
        assert worker["fairness"]["timeouts"] == 3
        assert stats["queue_depth"] == 0
