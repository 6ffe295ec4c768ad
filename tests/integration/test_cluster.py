"""The whole cluster of issue 19 on loopback: three `inferflux serve` replicas sharing one
real redis-server, and `inferflux router` in front of them. An admin change sent through
the router (it lands on one replica) is enforced by every replica; with Redis killed, the
router and replicas keep serving generations."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.security_support import RedisServer
from tests.integration.server_process import RouterProcess, ServerProcess

pytestmark = pytest.mark.server

ADMIN_KEY = "sk-test-cluster-admin-0123456789abcdef"
PASSPHRASE = "a cluster test passphrase"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    folder = tmp_path_factory.mktemp("cluster")
    redis = RedisServer()
    keys = [{"key": ADMIN_KEY, "id": "ops", "roles": ["admin"]}]
    replicas: list[ServerProcess] = []
    router: RouterProcess | None = None
    try:
        for i in range(3):
            env = {
                "INFERFLUX_REDIS_URL": redis.url,
                "INFERFLUX_REDIS__TIMEOUT_S": "1.0",
                "INFERFLUX_REDIS__POLICY_SYNC_INTERVAL_S": "1.0",
                "INFERFLUX_AUTH__API_KEYS": json.dumps(keys),
                "INFERFLUX_POLICY_STORE": str(folder / f"policy-{i}.store"),
                "INFERFLUX_POLICY_PASSPHRASE": PASSPHRASE,
                "INFERFLUX_RUNTIME__N_THREADS": "1",
            }
            replicas.append(
                ServerProcess("--workers", "1", env=env, log_path=folder / f"replica-{i}.log")
            )
        for replica in replicas:
            replica.wait_ready(240)
        router = RouterProcess(
            *(r.url for r in replicas),
            args=("--redis", redis.url),
            env={"INFERFLUX_ROUTER__HEALTH_INTERVAL_S": "0.5"},
            log_path=folder / "router.log",
        )
        router.wait_ready(60)
        yield router, replicas, redis
    finally:
        if router is not None:
            router.close()
        for replica in replicas:
            replica.close()
        redis.kill()


def _headers(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _model(url: str) -> str:
    listed = httpx.get(f"{url}/v1/models", headers=_headers(), timeout=10)
    assert listed.status_code == 200, listed.text
    return str(listed.json()["data"][0]["id"])


def _chat(url: str, key: str, text: str) -> httpx.Response:
    body = {
        "model": _model(url),
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "temperature": 0,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=_headers(key), timeout=60)


def _eventually(check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"
        time.sleep(0.05)


def test_a_key_created_through_the_router_works_on_every_replica(cluster):
    router, replicas, _ = cluster
    created = httpx.post(
        f"{router.url}/v1/admin/api_keys",
        json={"name": "app", "roles": ["user"]},
        headers=_headers(),
        timeout=30,
    )
    assert created.status_code == 201, created.text
    key = created.json()["key"]
    _eventually(
        lambda: all(
            httpx.get(f"{r.url}/v1/models", headers=_headers(key), timeout=10).status_code == 200
            for r in replicas
        ),
        2.0,
    )
    versions = {
        httpx.get(f"{r.url}/server/stats", headers=_headers(), timeout=10).json()["policy"][
            "version"
        ]
        for r in replicas
    }
    assert len(versions) == 1, versions
    answered_by = set()
    for i in range(6):
        reply = _chat(router.url, key, f"Say a word about the number {i}.")
        assert reply.status_code == 200, reply.text
        answered_by.add(reply.headers["x-inferflux-replica"])
    assert len(answered_by) >= 2, "new conversations spread over the replicas"


def test_a_guardrail_set_through_the_router_is_enforced_by_every_replica(cluster):
    router, replicas, _ = cluster
    rules = {"blocklist": ["clusterforbidden"]}
    put = httpx.put(f"{router.url}/v1/admin/guardrails", json=rules, headers=_headers(), timeout=30)
    assert put.status_code == 200, put.text
    for replica in replicas:
        _eventually(
            lambda r=replica: _chat(r.url, ADMIN_KEY, "say clusterforbidden").status_code == 400,
            2.0,
        )
    assert _chat(router.url, ADMIN_KEY, "say clusterforbidden please").status_code == 400


def test_with_redis_killed_the_cluster_keeps_generating(cluster):
    router, replicas, redis = cluster
    redis.kill()
    for i in range(4):
        reply = _chat(router.url, ADMIN_KEY, f"Count to {i + 2}.")
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] is not None
