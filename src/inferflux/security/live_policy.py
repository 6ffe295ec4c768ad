"""`LivePolicy`: the `PolicySource` of a running server, and how it is built at startup.

How config and store combine (docs/security.md "Policy store"):
- `base` (default limits, tiers, guardrails from their own settings sections) plus
  `auth.tenants` seed the policy. With `auth.policy_store` set and the file missing, the
  seed is written as a new store; once the file exists, **the store is authoritative** for
  keys, tenants, limits, tiers and guardrails (edit them with the admin API).
- `auth.api_keys` from the config are always added on top, every start, and never written
  to the store: they are the operator's keys (bootstrap, development), changed only in
  the config file. The admin API lists them (`source: config`) but refuses to revoke them.
- Without a store the policy lives in memory: admin changes apply at once and are lost on
  restart.

Every admin change goes through `update`: one at a time (an asyncio lock), the new policy
is written to the store first, and only once that succeeded replaces the snapshot that
`current()` hands out. Readers take `current()` per decision and never see half a change.

Replicated (a `PolicyPublisher` attached: security/policy_sync.py, with `redis.url`), the
commit point is Redis instead: `update` publishes the changed policy as the next version
only if the cluster is still at the version it was made from; when another replica got
there first, it installs the newer snapshot and runs the change again on it (at most
`MAX_ATTEMPTS` times). Once published, the change is written to this replica's store (a
failure is logged: the cluster has the change, and a restart catches up from Redis) and
swapped in. `apply` installs a snapshot that another replica published, only when its
version is newer than the one held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from inferflux.config.auth_settings import ApiKeySettings, AuthSettings, TenantSettings
from inferflux.errors import ConfigError, PolicyStoreError, PolicyUnavailable
from inferflux.security.api_keys import KeyDigester, default_key_id
from inferflux.security.policy import (
    ApiKeyRecord,
    Policy,
    RateLimits,
    TenantPolicy,
    to_rate_limits,
)
from inferflux.security.policy_store import PolicyStore
from inferflux.security.policy_witness import VersionWitness
from inferflux.security.principal import Scope

logger = logging.getLogger(__name__)


MAX_ATTEMPTS = 5  # a replicated change rebased on newer snapshots at most this often


class PolicyPublisher(Protocol):
    """Where a replicated change is committed (security/policy_sync.py)."""

    async def publish(self, policy: Policy, base_version: int) -> Policy | None:
        """Make `policy` the cluster's version `policy.version` if the cluster holds no
        version above `base_version`. None when published; else the cluster's newer
        policy (the caller rebases on it). Raises PolicyUnavailable (Redis unreachable:
        nothing was published)."""
        ...


class LivePolicy:
    """The current policy: stored part (changed by the admin API) + config keys."""

    def __init__(
        self, stored: Policy, config_keys: tuple[ApiKeyRecord, ...], store: PolicyStore | None
    ) -> None:
        self._stored = stored
        self._config_keys = config_keys
        self._config_ids = frozenset(k.key_id for k in config_keys)
        self._store = store
        self._current = self._merged(stored)
        self._lock = asyncio.Lock()
        self._publisher: PolicyPublisher | None = None

    @property
    def persistent(self) -> bool:
        """True when changes are written to a policy store (they survive a restart)."""
        return self._store is not None

    def current(self) -> Policy:
        return self._current

    def stored(self) -> Policy:
        """The stored part alone (what is persisted and replicated: no config keys)."""
        return self._stored

    def is_config_key(self, key_id: str) -> bool:
        return key_id in self._config_ids

    def attach(self, publisher: PolicyPublisher) -> None:
        """Commit every later change through `publisher` (replication) first."""
        self._publisher = publisher

    async def update(self, change: Callable[[Policy], Policy]) -> Policy:
        """Apply `change` to the stored policy, persist (and publish) it, then swap it in.
        `change` may raise (an InferfluxError for a bad request): nothing changes then.
        Raises PolicyUnavailable (503) when the store cannot be written, or, replicated,
        when Redis cannot be reached; nothing changes then."""
        async with self._lock:
            for _ in range(MAX_ATTEMPTS):
                base = self._stored
                changed = replace(change(base), version=base.version + 1)
                if self._publisher is None:
                    await self._persist(changed)
                    self._install(changed)
                    return self._current
                newer = await self._publisher.publish(changed, base.version)
                if newer is None:
                    await self._persist_replicated(changed)
                    self._install(changed)
                    return self._current
                logger.info(
                    "policy change from version %d rebased on version %d (another "
                    "replica changed the policy first)", base.version, newer.version,
                )  # fmt: skip
                await self._persist_replicated(newer)
                self._install(newer)
            raise PolicyUnavailable(
                "other policy changes kept landing first; the change was not applied, retry"
            )

    async def apply(self, policy: Policy) -> bool:
        """Install a replicated snapshot when it is newer than the one held (written to
        the store first, when there is one). False when it is not newer: never an older
        version over a newer one."""
        async with self._lock:
            if policy.version <= self._stored.version:
                return False
            await self._persist_replicated(policy)
            self._install(policy)
            return True

    async def _persist(self, policy: Policy) -> None:
        if self._store is None:
            return
        try:
            await asyncio.to_thread(self._store.save, policy)
        except PolicyStoreError as exc:
            logger.error("policy change not applied: %s", exc.message)
            raise PolicyUnavailable(
                "the policy store could not be written; the change was not applied"
            ) from None

    async def _persist_replicated(self, policy: Policy) -> None:
        """Write a committed (published) version to the store; a failure is logged, not
        raised: the version is in Redis, and this replica catches up from there again."""
        if self._store is None:
            return
        try:
            await asyncio.to_thread(self._store.save_if_newer, policy)
        except PolicyStoreError as exc:
            logger.error(
                "policy version %d applied but not written to the store: %s",
                policy.version, exc.message,
            )  # fmt: skip

    def _install(self, stored: Policy) -> None:
        self._stored = stored
        self._current = self._merged(stored)

    def _merged(self, stored: Policy) -> Policy:
        return replace(stored, keys=(*stored.keys, *self._config_keys))


def build_live_policy(
    auth: AuthSettings,
    base: Policy,
    digester: KeyDigester,
    roles: Mapping[str, frozenset[Scope]],
    store: PolicyStore | None = None,
    witnesses: Sequence[VersionWitness] | None = None,
) -> LivePolicy:
    """The startup policy (see the module docstring). `store` replaces the one that
    `auth.policy_store` names (tests); `witnesses` record its versions (default: the
    sidecar file; policy_witness.py). Raises PolicyStoreError when the store cannot be
    read or created or was rolled back, ConfigError when config keys clash."""
    config_keys = tuple(_config_key(entry, digester, roles) for entry in auth.api_keys)
    _check_unique(config_keys)
    seed = replace(base, tenants=_merged_tenants(base, auth.tenants))
    if store is None and auth.policy_store is not None:
        assert auth.policy_passphrase is not None  # NOTE: AuthSettings requires it
        store = PolicyStore(
            Path(auth.policy_store),
            auth.policy_passphrase.get_secret_value(),
            witnesses=witnesses,
            accept_rollback=auth.policy_accept_rollback,
        )
    stored = seed
    if store is not None and store.exists():
        stored = store.load()
        logger.info(
            "policy store %s: version %d, %d key(s)", store.path, stored.version, len(stored.keys)
        )
    elif store is not None:
        store.save(seed)
        logger.info("policy store %s created from the configuration", store.path)
    clash = {k.key_id for k in stored.keys} & {k.key_id for k in config_keys}
    if clash:
        raise ConfigError(
            f"auth.api_keys: key id(s) {sorted(clash)} also exist in the policy store; "
            "rename them in the config"
        )
    return LivePolicy(stored, config_keys, store)


def _config_key(
    entry: ApiKeySettings, digester: KeyDigester, roles: Mapping[str, frozenset[Scope]]
) -> ApiKeyRecord:
    if entry.key is not None:
        digest = digester.digest(entry.key.get_secret_value())
    else:
        assert entry.sha256 is not None  # NOTE: ApiKeySettings requires one of the two
        digest = entry.sha256
    scopes = frozenset(Scope(s) for s in entry.scopes).union(*(roles[r] for r in entry.roles))
    return ApiKeyRecord(
        key_id=entry.id or default_key_id(digest),
        digest=digest,
        tenant=entry.tenant,
        scopes=scopes,
        limits=limits_of(entry),
        rate_limit_tier=entry.rate_limit_tier,
        priority_cap=entry.priority_cap,
        allowed_models=None if entry.allowed_models is None else frozenset(entry.allowed_models),
        name="config",
    )


def limits_of(entry: ApiKeySettings | TenantSettings) -> RateLimits | None:
    """The entry's limits, or None when it sets none."""
    limits = to_rate_limits(entry)
    return None if limits == RateLimits() else limits


def _check_unique(keys: tuple[ApiKeyRecord, ...]) -> None:
    digests = [k.digest for k in keys]
    if len(digests) != len(set(digests)):
        raise ConfigError("auth.api_keys: the same key is listed twice; remove the duplicate")
    ids = [k.key_id for k in keys]
    if len(ids) != len(set(ids)):
        raise ConfigError("auth.api_keys: two keys have the same id; give them distinct ids")


def _merged_tenants(base: Policy, configured: Iterable[TenantSettings]) -> tuple[TenantPolicy, ...]:
    """`base` tenants, replaced by configured ones of the same name (a configured tenant
    without limits gets the default limits, like a tenant nobody configured)."""
    tenants = {t.tenant: t for t in base.tenants}
    for entry in configured:
        tenants[entry.name] = TenantPolicy(
            tenant=entry.name,
            limits=limits_of(entry) or base.default_limits,
            allowed_models=None
            if entry.allowed_models is None
            else frozenset(entry.allowed_models),
            priority_cap=entry.priority_cap,
            share_prefix_cache=entry.share_prefix_cache,
        )
    return tuple(tenants.values())
