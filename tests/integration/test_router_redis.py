"""Two routers sharing the prefix-affinity directory through a real redis-server.

The replicas are `FakeReplicas` (the routing decision is the logic under test; the real
replicas' part is in test_router.py); Redis is real, and killed to show the routers keep
routing on their own index while it is gone.
"""

from __future__ import annotations

import httpx
import pytest

from inferflux.config.router_settings import RouterSettings
from inferflux.router import RouterApp
from tests.fakes.replicas import FakeReplicas, replica_urls
from tests.integration.security_support import RedisServer

CHAT = "/v1/chat/completions"
SYSTEM = "You are a helpful assistant who answers in one short sentence. "


@pytest.fixture
def redis_server():
    server = RedisServer()
    yield server
    server.kill()


async def _router(redis_url: str, fake: FakeReplicas) -> tuple[RouterApp, httpx.AsyncClient]:
    settings = RouterSettings(
        replicas=replica_urls(3),
        health_interval_s=300,
        affinity_block_chars=16,
        redis_url=redis_url,
    )
    app = RouterApp(settings, transport=fake)
    await app.startup()
    return app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r")


def _turns(name: str, n: int) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(n):
        messages += [{"role": "user", "content": f"{name} question {i} " * 3}]
        messages += [{"role": "assistant", "content": f"answer {i}"}]
    return {"model": "m", "messages": messages[:-1]}


async def test_a_second_router_sends_turn_two_where_the_first_sent_turn_one(redis_server):
    fake = FakeReplicas(3)
    first, first_client = await _router(redis_server.url, fake)
    second, second_client = await _router(redis_server.url, fake)
    try:
        homes = []
        for name in ("alpha", "beta"):  # alpha → replica 0, beta → replica 1 (rotation)
            answer = await first_client.post(CHAT, json=_turns(name, 1))
            homes.append(answer.headers["x-inferflux-replica"])
        assert homes == ["0", "1"]
        assert first.directory is not None
        await first.directory.flush()
        # the second router has seen nothing; its own rotation would say replica 0
        answer = await second_client.post(CHAT, json=_turns("beta", 2))
        assert answer.headers["x-inferflux-replica"] == "1"
        assert second.stats()["decisions"] == {"affinity": 1.0}

        redis_server.kill()  # Redis gone: still served, on the local index
        answer = await second_client.post(CHAT, json=_turns("beta", 3))
        assert answer.status_code == 200
        assert answer.headers["x-inferflux-replica"] == "1"  # its own record of turn 2
    finally:
        for app, client in ((first, first_client), (second, second_client)):
            await client.aclose()
            await app.shutdown()
