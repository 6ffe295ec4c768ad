"""How config keys, the seed and the store combine at startup, and atomic updates."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferflux.config.auth_settings import AuthSettings
from inferflux.errors import ConfigError, InvalidRequest, PolicyStoreError, PolicyUnavailable
from inferflux.security.api_keys import KeyDigester
from inferflux.security.live_policy import build_live_policy
from inferflux.security.policy import ApiKeyRecord, Policy, RateLimits
from inferflux.security.policy_store import PolicyStore
from inferflux.security.principal import Scope
from inferflux.security.rbac import roles_table

PASS = "correct horse battery staple"


def auth(**values) -> AuthSettings:
    return AuthSettings.model_validate(values)


def build(settings: AuthSettings, store: PolicyStore | None = None, base: Policy | None = None):
    return build_live_policy(
        settings, base or Policy(), KeyDigester(), roles_table(settings.roles), store
    )


def test_config_keys_are_hashed_with_scopes_from_roles():
    settings = auth(
        api_keys=[
            {"key": "dev-key-123", "scopes": ["generate"], "roles": ["reader"], "tenant": "a"},
            {"sha256": "AB" * 32, "id": "ops", "roles": ["admin"], "requests_per_minute": 5},
        ]
    )
    keys = build(settings).current().keys
    assert [k.key_id for k in keys] == [f"cfg-{KeyDigester().digest('dev-key-123')[:12]}", "ops"]
    assert keys[0].scopes == {Scope.GENERATE, Scope.READ} and keys[0].tenant == "a"
    assert keys[0].digest == KeyDigester().digest("dev-key-123")
    assert "dev-key-123" not in repr(keys)
    assert keys[1].digest == "ab" * 32 and keys[1].scopes == frozenset(Scope)
    assert keys[1].limits == RateLimits(requests_per_minute=5)


def test_duplicate_config_keys_are_refused():
    same = [{"key": "dev-key-123", "scopes": ["read"]}] * 2
    with pytest.raises(ConfigError, match="listed twice"):
        build(auth(api_keys=same))


def test_tenants_seed_from_config_with_default_limits():
    base = Policy(default_limits=RateLimits(requests_per_minute=10))
    settings = auth(tenants=[{"name": "a"}, {"name": "b", "max_concurrent": 2}])
    tenants = build(settings, base=base).current().tenants
    assert [t.limits for t in tenants] == [RateLimits(10), RateLimits(max_concurrent=2)]


async def test_the_store_is_created_then_authoritative_and_config_keys_never_stored(tmp_path):
    store = PolicyStore(tmp_path / "p.store", PASS, log2_n=14)
    settings = auth(api_keys=[{"key": "dev-key-123", "scopes": ["admin"]}], tenants=[{"name": "a"}])
    live = build(settings, store)
    assert store.exists() and store.load().keys == ()
    extra = ApiKeyRecord("key_x", "cd" * 32, "a", frozenset({Scope.READ}))
    await live.update(lambda p: replace(p, keys=(*p.keys, extra)))
    assert live.current().version == 1 and len(live.current().keys) == 2
    assert store.load().keys == (extra,)
    # a restart with other tenants in the config: the store wins; config keys come back
    reloaded = build(auth(api_keys=settings.api_keys, tenants=[{"name": "b"}]), store)
    assert [t.tenant for t in reloaded.current().tenants] == ["a"]
    assert [k.key_id for k in reloaded.current().keys] == ["key_x", live.current().keys[1].key_id]
    assert reloaded.is_config_key(live.current().keys[1].key_id)


async def test_a_failing_change_or_store_changes_nothing(tmp_path):
    store = PolicyStore(tmp_path / "dir" / "p.store", PASS, log2_n=14)
    live = build(auth(), store)
    before = live.current()
    saved = store.path.read_bytes()

    def bad(policy: Policy) -> Policy:
        raise InvalidRequest("no")

    with pytest.raises(InvalidRequest):
        await live.update(bad)
    # the store's folder becomes a plain file: every write fails (even as root)
    (tmp_path / "dir").rename(tmp_path / "moved")
    (tmp_path / "dir").write_bytes(b"")
    with pytest.raises(PolicyUnavailable):
        await live.update(lambda p: replace(p, default_limits=RateLimits(1)))
    assert live.current() is before
    assert (tmp_path / "moved" / "p.store").read_bytes() == saved


def test_a_damaged_store_stops_the_build(tmp_path):
    path = tmp_path / "p.store"
    path.write_bytes(b"not a store at all, just some bytes" * 3)
    with pytest.raises(PolicyStoreError, match="not an InferFlux policy store"):
        build(auth(), PolicyStore(path, PASS))
