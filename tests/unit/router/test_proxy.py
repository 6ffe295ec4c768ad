"""The router's forwarding logic over `FakeReplicas`: retries of refused requests, 503
pass-through, ejection, the router's own 503/413, and streams cut mid-way."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from inferflux.config.router_settings import RouterSettings
from inferflux.router import RouterApp
from tests.fakes.replicas import FakeReplicas, replica_urls

CHAT = "/v1/chat/completions"


@pytest.fixture
async def router():
    fake = FakeReplicas(3)
    settings = RouterSettings(
        replicas=replica_urls(3), routing="round_robin", health_interval_s=300
    )
    app = RouterApp(settings, transport=fake)
    await app.startup()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r")
    yield app, fake, client
    await client.aclose()
    await app.shutdown()


async def test_requests_spread_and_credentials_pass(router):
    app, fake, client = router
    served = []
    for _ in range(3):
        answer = await client.post(CHAT, json={"model": "m"}, headers={"Authorization": "Bearer k"})
        assert answer.status_code == 200
        assert answer.json()["auth"] == "Bearer k"
        served.append(answer.headers["x-inferflux-replica"])
    assert served == ["0", "1", "2"]


async def test_a_refused_request_is_retried_elsewhere_and_the_replica_ejected(router):
    app, fake, client = router
    fake.modes["replica0"] = "refuse"
    answer = await client.post(CHAT, json={"model": "m"})
    assert answer.status_code == 200 and answer.headers["x-inferflux-replica"] == "1"
    assert [host for host, _, _ in fake.log] == ["replica0", "replica1"]
    assert fake.log[0][2] == fake.log[1][2]  # the body replayed unchanged
    assert not app.replicas[0].healthy
    assert app.stats()["retries"] == {"connect_error": 1.0}


async def test_busy_replicas_are_skipped_and_the_last_503_passes(router):
    app, fake, client = router
    fake.modes["replica0"] = "busy"
    assert (await client.post(CHAT, json={})).headers["x-inferflux-replica"] == "1"
    for host in fake.modes:
        fake.modes[host] = "busy"
    answer = await client.post(CHAT, json={})
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "queue_full"  # the replica's own answer
    assert app.replicas[0].healthy  # busy is not dead


async def test_no_healthy_replica_gives_an_openai_503_with_retry_after(router):
    app, fake, client = router
    for replica in app.replicas:
        replica.eject("test")
    answer = await client.post(CHAT, json={})
    assert answer.status_code == 503
    assert answer.headers["retry-after"]
    assert answer.json()["error"]["type"] == "service_unavailable"
    assert (await client.get("/readyz")).status_code == 503


async def test_a_body_over_the_limit_gets_413(router):
    app, fake, client = router
    answer = await client.post(CHAT, content=b"x" * (app.settings.max_request_bytes + 1))
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    assert fake.log == []


async def test_a_cut_sse_stream_ends_with_an_error_then_done(router):
    app, fake, client = router
    fake.modes["replica0"] = "cut"
    answer = await client.post(CHAT, json={"stream": True})
    events = [e for e in answer.content.split(b"\n\n") if e]
    assert events[0] == b'data: {"choices": []}'
    assert json.loads(events[-2].removeprefix(b"data: "))["error"]["code"] == "worker_died"
    assert events[-1] == b"data: [DONE]"
    assert len(events) == 3  # the half-sent event was held back
    assert not app.replicas[0].healthy


async def test_a_cut_ollama_stream_ends_with_an_error_line(router):
    app, fake, client = router
    fake.modes["replica0"] = "cut"
    answer = await client.post("/api/chat", json={"stream": True})
    lines = [json.loads(line) for line in answer.content.splitlines()]
    assert lines[0] == {"message": "tok"} and "error" in lines[-1] and len(lines) == 2


async def test_health_checks_eject_and_readmit(router):
    app, fake, client = router
    fake.modes["replica2"] = "down"
    for _ in range(app.settings.eject_after_failures):
        await app._health.check_all()
    assert not app.replicas[2].healthy and app.replicas[2].num_ejections == 1
    fake.modes["replica2"] = "ok"
    await app._health.check_all()
    assert app.replicas[2].healthy
    stats = (await client.get("/router/stats")).json()
    assert [r["healthy"] for r in stats["replicas"]] == [True, True, True]


async def test_a_hung_replica_is_ejected_and_its_streams_end_with_an_error(router):
    app, fake, client = router
    fake.modes["replica0"] = "hang"
    stream = asyncio.create_task(client.post(CHAT, json={"stream": True}))
    await asyncio.wait_for(fake.hanging.wait(), 5)
    fake.modes["replica0"] = "down"  # stops answering health checks too
    for _ in range(app.settings.eject_after_failures):
        await app._health.check_all()
    answer = await asyncio.wait_for(stream, 5)
    events = [e for e in answer.content.split(b"\n\n") if e]
    assert events[0] == b'data: {"choices": []}'
    assert json.loads(events[1].removeprefix(b"data: "))["error"]["code"] == "worker_died"
    assert events[-1] == b"data: [DONE]"
    assert not app.replicas[0].healthy


async def test_a_draining_replica_keeps_its_streams(router):
    app, fake, client = router
    fake.modes["replica0"] = "hang"
    stream = asyncio.create_task(client.post(CHAT, json={"stream": True}))
    await asyncio.wait_for(fake.hanging.wait(), 5)
    fake.modes["replica0"] = "draining"  # /readyz 503: out of rotation, streams go on
    for _ in range(app.settings.eject_after_failures):
        await app._health.check_all()
    assert not app.replicas[0].healthy
    await asyncio.sleep(0.1)
    assert not stream.done()
    stream.cancel()


def test_stats_never_show_a_replica_urls_credentials():
    settings = RouterSettings(replicas=["http://ops:s3cret@replica0:8080/?token=t0k"])
    replica = RouterApp(settings).stats()["replicas"][0]
    assert "s3cret" not in replica["url"] and "t0k" not in replica["url"]
