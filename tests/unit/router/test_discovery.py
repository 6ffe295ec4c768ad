"""Replicas found through DNS: resolution, and joining / leaving the rotation."""

from __future__ import annotations

import httpx

from inferflux.config.router_settings import RouterSettings
from inferflux.router import RouterApp
from inferflux.router.discovery import ReplicaDiscovery, replica_url
from tests.fakes.replicas import FakeReplicas, replica_urls

CHAT = "/v1/chat/completions"


async def _unused(found: list[str]) -> None:
    raise AssertionError(found)


async def test_a_name_resolves_to_one_url_per_address():
    found = await ReplicaDiscovery("http://localhost:8080", 5, _unused).resolve()
    assert found is not None and "http://127.0.0.1:8080" in found
    assert await ReplicaDiscovery("http://no-such-host.invalid:1", 5, _unused).resolve() is None
    assert replica_url("http", "::1", 8080) == "http://[::1]:8080"


def test_replica_dns_takes_host_port_or_a_url():
    assert RouterSettings(replica_dns="svc:8080").replica_dns == "http://svc:8080"
    assert RouterSettings(replica_dns="https://svc:8443").replica_dns == "https://svc:8443"


async def test_replicas_join_and_leave_and_slots_are_reused():
    fake = FakeReplicas(3)
    app = RouterApp(RouterSettings(routing="round_robin", health_interval_s=300), transport=fake)
    await app.startup()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r")
    try:
        urls = replica_urls(3)
        await app.sync_replicas(urls[:2])
        assert (await client.get("/readyz")).status_code == 503  # not checked yet
        await app._health.check_all()
        served = {(await client.post(CHAT, json={})).json()["served_by"] for _ in range(4)}
        assert served == {"replica0", "replica1"}

        await app.sync_replicas(urls[1:2])  # replica0 left the Service
        assert app.replicas[0].retired and not app.replicas[0].healthy
        served = {(await client.post(CHAT, json={})).json()["served_by"] for _ in range(3)}
        assert served == {"replica1"}

        await app.sync_replicas(urls[1:])  # replica2 arrives: it takes slot 0
        await app._health.check_all()
        assert len(app.replicas) == 2 and app.replicas[0].url == urls[2]
        served = {(await client.post(CHAT, json={})).json()["served_by"] for _ in range(4)}
        assert served == {"replica1", "replica2"}
    finally:
        await client.aclose()
        await app.shutdown()
