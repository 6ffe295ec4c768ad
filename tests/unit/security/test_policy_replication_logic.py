"""Policy replication's pure logic: snapshots (sealed, plain, bound to their version) and
`LivePolicy`'s replicated commit: compare and set, rebase on a newer version, never an
older version over a newer one, nothing applied while the cluster is unreachable."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferflux.errors import Conflict, PolicyUnavailable
from inferflux.security.live_policy import LivePolicy
from inferflux.security.policy import ApiKeyRecord, Policy, RateLimits, TenantPolicy
from inferflux.security.policy_codec import SnapshotCodec, SnapshotError
from inferflux.security.policy_store import PolicyStore
from inferflux.security.principal import Scope
from tests.fakes.publisher import FakePublisher

PASS = "correct horse battery staple"
FAST = 14
KEY = ApiKeyRecord("key_a", "ab" * 32, "t", frozenset({Scope.READ}))


def _policy(version: int, rpm: int = 5) -> Policy:
    return Policy(keys=(KEY,), default_limits=RateLimits(rpm), version=version)


def test_a_sealed_snapshot_opens_only_with_its_passphrase_namespace_and_version():
    codec = SnapshotCodec("ns", PASS, log2_n=FAST)
    blob = codec.seal(_policy(3))
    assert codec.open(blob, 3) == _policy(3)
    assert b"ab" * 8 not in blob  # the digest is encrypted too
    with pytest.raises(SnapshotError, match="does not decrypt"):
        codec.open(blob, 4)  # replayed under another version
    with pytest.raises(SnapshotError, match="does not decrypt"):
        SnapshotCodec("other", PASS, log2_n=FAST).open(blob, 3)
    with pytest.raises(SnapshotError, match="does not decrypt"):
        SnapshotCodec("ns", "another passphrase!", log2_n=FAST).open(blob, 3)
    tampered = bytearray(blob)
    tampered[-1] ^= 1
    with pytest.raises(SnapshotError):
        codec.open(bytes(tampered), 3)
    with pytest.raises(SnapshotError, match="same INFERFLUX_POLICY_PASSPHRASE"):
        SnapshotCodec("ns", None).open(blob, 3)


def test_a_plain_snapshot_holds_digests_and_its_version():
    codec = SnapshotCodec("ns", None)
    assert not codec.sealed
    blob = codec.seal(_policy(2))
    assert codec.open(blob, 2) == _policy(2)
    with pytest.raises(SnapshotError, match="holds version 2, published as 7"):
        codec.open(blob, 7)
    with pytest.raises(SnapshotError, match="not a policy snapshot"):
        codec.open(b"garbage", 2)


async def test_a_replicated_change_is_published_then_installed():
    live = LivePolicy(_policy(4), (), None)
    publisher = FakePublisher(_policy(4))
    live.attach(publisher)
    changed = await live.update(lambda p: replace(p, default_limits=RateLimits(9)))
    assert changed.version == 5 and publisher.published == [5]
    assert publisher.cluster.default_limits == RateLimits(9)


async def test_a_change_from_a_stale_base_is_rebased_on_the_newer_version():
    live = LivePolicy(_policy(1), (), None)
    other = replace(_policy(2), tenants=(TenantPolicy("b"),))  # another replica's change
    publisher = FakePublisher(other)
    live.attach(publisher)
    changed = await live.update(lambda p: replace(p, tenants=(*p.tenants, TenantPolicy("c"))))
    assert changed.version == 3
    assert [t.tenant for t in changed.tenants] == ["b", "c"]  # b's change is kept

    def create_b(policy: Policy) -> Policy:
        if any(t.tenant == "b" for t in policy.tenants):
            raise Conflict("tenant b exists")
        return replace(policy, tenants=(*policy.tenants, TenantPolicy("b")))

    live = LivePolicy(_policy(1), (), None)
    live.attach(FakePublisher(other))
    with pytest.raises(Conflict):  # checked again on the newest snapshot
        await live.update(create_b)
    assert live.current().version == 2  # the newer version was installed all the same


async def test_nothing_changes_while_the_cluster_is_unreachable(tmp_path):
    store = PolicyStore(tmp_path / "p.store", PASS, log2_n=FAST)
    store.save(_policy(1))
    live = LivePolicy(_policy(1), (), store)
    publisher = FakePublisher(_policy(1))
    publisher.down = True
    live.attach(publisher)
    before = live.current()
    with pytest.raises(PolicyUnavailable, match="replication unavailable"):
        await live.update(lambda p: replace(p, default_limits=RateLimits(1)))
    assert live.current() is before and store.load().version == 1


async def test_apply_installs_only_newer_versions_and_writes_the_store(tmp_path):
    store = PolicyStore(tmp_path / "p.store", PASS, log2_n=FAST)
    store.save(_policy(3))
    live = LivePolicy(_policy(3), (), store)
    assert not await live.apply(_policy(2, rpm=99))  # older: ignored
    assert not await live.apply(_policy(3, rpm=99))  # same version: ignored
    assert live.current().default_limits == RateLimits(5)
    assert await live.apply(_policy(7, rpm=11))
    assert live.current().version == 7 and store.load().default_limits == RateLimits(11)


def test_save_if_newer_never_lowers_a_shared_store(tmp_path):
    path = tmp_path / "shared.store"
    first = PolicyStore(path, PASS, log2_n=FAST)
    second = PolicyStore(path, PASS, log2_n=FAST)  # another replica, same file
    assert first.save_if_newer(_policy(5))
    assert not second.save_if_newer(_policy(4))
    assert not second.save_if_newer(_policy(5))
    assert second.save_if_newer(_policy(6, rpm=8))
    assert PolicyStore(path, PASS).load() == _policy(6, rpm=8)
