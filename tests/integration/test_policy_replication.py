"""Policy replication through a real redis-server, replicas in this process (`LivePolicy`
+ `PolicySync`, no model): changes reach the others, concurrent changes are both kept,
an older version never replaces a newer one, a replica that missed messages catches up,
and a Redis that is killed and restarted (losing its data) is re-seeded. The same with
real `inferflux serve` replicas: tests/integration/test_policy_replication_servers.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest
import redis

from inferflux.config.security_settings import RedisSettings
from inferflux.errors import PolicyUnavailable
from inferflux.security.live_policy import LivePolicy
from inferflux.security.policy import Policy, RateLimits, TenantPolicy
from inferflux.security.policy_codec import SnapshotCodec
from inferflux.security.policy_store import PolicyStore
from inferflux.security.policy_sync import PolicySync, make_policy_sync
from tests.integration.security_support import RedisServer

PASS = "a replication test passphrase"
FAST = 14  # scrypt cost for tests


class Cluster:
    """Replicas sharing one Redis namespace; closed at the end of the test."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.namespace = f"t:repl:{uuid.uuid4().hex[:8]}"
        self.syncs: list[PolicySync] = []

    async def replica(
        self,
        *,
        start: bool = True,
        store: PolicyStore | None = None,
        passphrase: str | None = PASS,
        seed: Policy | None = None,
    ) -> tuple[LivePolicy, PolicySync]:
        live = LivePolicy(seed or Policy(), (), store)
        settings = RedisSettings.model_validate(
            {
                "url": self.url,
                "timeout_s": 1.0,
                "policy_sync_interval_s": 0.2,
                "policy_namespace": self.namespace,
            }
        )
        sync = make_policy_sync(settings, live, passphrase, log2_n=FAST)
        assert sync is not None
        self.syncs.append(sync)
        if start:
            await sync.start()
        return live, sync

    async def close(self) -> None:
        for sync in self.syncs:
            await sync.close()


@pytest.fixture
async def cluster(redis_server) -> AsyncIterator[Cluster]:
    made = Cluster(redis_server.url)
    yield made
    await made.close()


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        await asyncio.sleep(0.01)


def _limit(rpm: int) -> Callable[[Policy], Policy]:
    return lambda p: replace(p, default_limits=RateLimits(rpm))


def _tenant(name: str) -> Callable[[Policy], Policy]:
    return lambda p: replace(p, tenants=(*p.tenants, TenantPolicy(name)))


async def test_a_change_reaches_every_replica_in_version_order(cluster):
    replicas = [await cluster.replica() for _ in range(3)]
    (a, _), (b, b_sync), (c, _) = replicas
    for rpm in (10, 20, 30):
        await a.update(_limit(rpm))
    await eventually(lambda: b.current().version == c.current().version == 3)
    assert b.current().default_limits == c.current().default_limits == RateLimits(30)
    status = b_sync.status()
    assert status.version == 3 and status.redis_up and status.lag_s is not None
    assert status.lag_s < 5


async def test_concurrent_changes_on_two_replicas_are_both_kept(cluster):
    (a, _), (b, b_sync) = await cluster.replica(), await cluster.replica()
    (c, _) = await cluster.replica()
    for i in range(5):
        await asyncio.gather(a.update(_tenant(f"a{i}")), b.update(_tenant(f"b{i}")))
    await eventually(lambda: a.current().version == b.current().version == c.current().version)
    names = {t.tenant for t in c.current().tenants}
    assert names == {f"{r}{i}" for r in "ab" for i in range(5)}
    assert c.current().version == 10  # one version per change, decided by Redis
    assert a.current() == b.current() == c.current()
    conflicts = b_sync.status().conflicts + cluster.syncs[0].status().conflicts
    assert conflicts >= 1  # at least one change was rebased, none lost


async def test_an_older_version_never_replaces_a_newer_one(cluster, redis_server):
    (a, _), (b, _) = await cluster.replica(), await cluster.replica()
    for rpm in (1, 2, 3):
        await a.update(_limit(rpm))
    await eventually(lambda: b.current().version == 3)
    old = SnapshotCodec(cluster.namespace, PASS, log2_n=FAST).seal(
        replace(Policy(), default_limits=RateLimits(999), version=2)
    )
    client = redis_server.client()
    try:
        # an old snapshot put back and announced: ignored, and Redis is set right again
        client.mset({f"{cluster.namespace}:version": 2, f"{cluster.namespace}:snapshot": old})
        client.publish(f"{cluster.namespace}:changes", "2")
        await eventually(lambda: client.get(f"{cluster.namespace}:version") == b"3")
    finally:
        client.close()
    assert b.current().version == 3 and b.current().default_limits == RateLimits(3)
    assert not await b.apply(replace(b.current(), default_limits=RateLimits(7), version=1))
    assert b.current().default_limits == RateLimits(3)


async def test_a_snapshot_sealed_with_another_passphrase_is_refused(cluster):
    (a, _) = await cluster.replica()
    (b, b_sync) = await cluster.replica(passphrase="another passphrase entirely")
    await a.update(_limit(5))
    await eventually(lambda: b_sync.status().rejected >= 1)
    assert b.current().version == 0


async def test_a_replica_that_missed_messages_catches_up(cluster, redis_server):
    (a, _) = await cluster.replica()
    (late, late_sync) = await cluster.replica(start=False)  # down while changes are made
    for rpm in (4, 5, 6):
        await a.update(_limit(rpm))
    await late_sync.start()
    assert late.current().version == 3  # caught up before `start` returned
    # a running replica whose subscription is dropped: the periodic check catches up
    (b, b_sync) = await cluster.replica()
    client = redis_server.client()
    try:
        client.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    finally:
        client.close()
    await a.update(_limit(7))
    await eventually(lambda: b.current().version == 4 and late.current().version == 4)
    assert b.current().default_limits == RateLimits(7)


async def test_redis_killed_and_restarted_replicas_keep_the_policy_and_catch_up(tmp_path):
    server = RedisServer()
    cluster = Cluster(server.url)
    try:
        stores = [PolicyStore(tmp_path / f"{i}.store", PASS, log2_n=FAST) for i in range(2)]
        (a, a_sync) = await cluster.replica(store=stores[0])
        (b, b_sync) = await cluster.replica(store=stores[1])
        await a.update(_limit(11))
        await eventually(lambda: b.current().version == 1)
        assert stores[1].load().default_limits == RateLimits(11)  # written at rest too
        server.kill()
        with pytest.raises(PolicyUnavailable, match="replication unavailable"):
            await a.update(_limit(12))
        assert a.current().version == 1 and stores[0].load().version == 1
        await eventually(lambda: not b_sync.status().redis_up)
        assert b.current().default_limits == RateLimits(11)  # still serving its policy
        server = RedisServer(port=server.port)  # empty: it lost version 1
        await eventually(lambda: a_sync.status().redis_up and b_sync.status().redis_up)
        await eventually(lambda: _version(server) == 1)  # re-seeded by a replica
        await b.update(_limit(13))
        await eventually(lambda: a.current().version == 2)
        assert a.current().default_limits == RateLimits(13)
        assert stores[0].load().version == 2
    finally:
        await cluster.close()
        server.kill()


def _version(server: RedisServer) -> int | None:
    client = server.client()
    try:
        keys = client.keys("t:repl:*:version")
        return int(client.get(keys[0])) if keys else None
    except redis.RedisError:
        return None
    finally:
        client.close()


async def test_replicas_sharing_one_store_file_only_move_it_forward(cluster, tmp_path):
    path = tmp_path / "shared.store"
    PolicyStore(path, PASS, log2_n=FAST).save(Policy())
    stores = [PolicyStore(path, PASS, log2_n=FAST) for _ in range(3)]
    replicas = [await cluster.replica(store=store) for store in stores]
    for i in range(6):
        live, _ = replicas[i % 3]
        await live.update(_limit(100 + i))
    await eventually(lambda: all(live.current().version == 6 for live, _ in replicas))
    # every replica wrote every version it applied: the file holds the newest, and a
    # restart loads it (no rollback refusal from the shared sidecar)
    assert PolicyStore(path, PASS).load().default_limits == RateLimits(105)
