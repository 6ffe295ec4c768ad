"""Routing between two workers of a real server (`--workers 2`, SmolLM2): with
`prefix_affinity` (the default) every turn of a conversation finds its earlier turns in
its worker's prefix cache; `scheduler.routing` changes live through PATCH
/v1/admin/config, and a bad value is refused naming the setting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

TOPICS = ("the sea", "mountains", "bread", "trains", "owls", "copper")
TURNS = ("Tell me about {}.", "Say more about it.", "Sum it up in five words.")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("log") / "server.log"
    env = {"INFERFLUX_MODEL__CTX_SIZE": "1024"}  # small contexts keep the KV memory low
    proc = ServerProcess("--workers", "2", env=env, log_path=log)
    try:
        proc.wait_ready()
        deadline = time.monotonic() + 120  # /readyz needs one worker; wait for both
        while time.monotonic() < deadline:
            workers = httpx.get(f"{proc.url}/server/stats", timeout=5).json()["workers"]
            if all(w["ready"] for w in workers):
                break
            time.sleep(0.2)
        yield proc
    finally:
        proc.close()


async def _turn(client: httpx.AsyncClient, messages: list[dict[str, str]]) -> dict:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0}
    answer = await client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


async def _conversation(client: httpx.AsyncClient, topic: str) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each turn of one conversation."""
    messages: list[dict[str, str]] = []
    usage = []
    for text in TURNS:
        messages.append({"role": "user", "content": text.format(topic)})
        reply = await _turn(client, messages)
        messages.append(reply["choices"][0]["message"])
        tokens = reply["usage"]
        usage.append((tokens["prompt_tokens"], tokens["prompt_tokens_details"]["cached_tokens"]))
    return usage


async def _stats(client: httpx.AsyncClient) -> dict:
    return (await client.get("/server/stats")).json()


async def test_conversations_keep_their_prefix_cache_with_two_workers(server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        assert (await _stats(client))["routing"]["strategy"] == "prefix_affinity"
        usages = await asyncio.gather(*(_conversation(client, t) for t in TOPICS))
        stats = await _stats(client)
    # a turn can reuse at least the whole prompt of the turn before it
    reusable = sum(usage[k - 1][0] for usage in usages for k in range(1, len(TURNS)))
    cached = sum(usage[k][1] for usage in usages for k in range(1, len(TURNS)))
    assert cached >= 0.9 * reusable, (cached, reusable, usages)
    workers = stats["workers"]
    assert all(w["num_generated_tokens_total"] > 0 for w in workers)  # both served
    decisions = stats["routing"]["decisions"]
    assert decisions.get("prefix_affinity/affinity", 0) >= len(TOPICS) * (len(TURNS) - 1)
    assert all(w["routing"]["indexed_blocks"] > 0 for w in workers)


async def test_routing_changes_live_and_a_bad_value_is_refused(server) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        bad = await client.patch("/v1/admin/config", json={"scheduler": {"routing": "random"}})
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "scheduler.routing"
        change = {"scheduler": {"routing": "round_robin"}}
        answer = await client.patch("/v1/admin/config", json=change)
        assert answer.status_code == 200, answer.text
        assert answer.json()["changed"] == ["scheduler.routing"]
        try:
            assert (await _stats(client))["routing"]["strategy"] == "round_robin"
            for _ in range(4):  # one after another: least-loaded would pick worker 0 each time
                await _turn(client, [{"role": "user", "content": "Name a colour."}])
            workers = (await _stats(client))["workers"]
            picks = [w["routing"]["decisions"].get("round_robin/round_robin", 0) for w in workers]
            assert picks == [2, 2]
            metrics = (await client.get("/metrics")).text
            series = (
                'inferflux_routing_decisions_total{outcome="round_robin",strategy="round_robin"}'
            )
            assert f"{series} 4.0" in metrics
        finally:
            reset = {"scheduler": {"routing": "prefix_affinity"}}
            assert (await client.patch("/v1/admin/config", json=reset)).status_code == 200
