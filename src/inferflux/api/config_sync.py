"""`ConfigSync`: the live config (PATCH /v1/admin/config) replicated across replicas
through Redis, when `redis.url` is set and `redis.config_sync` is on.

The live config is one `DocumentSync` document (security/replication.py) under
`<redis.policy_namespace>:config`. A snapshot is every live key's effective value on the
replica that published it (JSON: dotted key → value; nothing secret: scheduler and
logging knobs), at a version Redis decides (compare and set). A PATCH is checked here
first (`LiveConfig.preview`), published as the next version, then applied; when another
replica published first, its snapshot is applied and the PATCH is made again on top. A
replica applies another's snapshot with `LiveConfig.patch` (whole, checked by the config
schema: a snapshot this replica cannot apply, say a `max_batch_tokens` above its own
contexts' batch, is refused and logged, and it keeps its values). Entries of a map
(`observability.tenant_logging`) that the snapshot lacks are removed. While Redis is
unreachable a PATCH is refused with 503 ("config replication unavailable").

The snapshot is not encrypted or authenticated: whoever can write to Redis can change
these knobs (not the policy: that snapshot is sealed, security/policy_sync.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inferflux.api.live_config import LiveConfig
from inferflux.config.live import LIVE_KEYS
from inferflux.config.security_settings import RedisSettings
from inferflux.errors import InferfluxError, ServiceUnavailable
from inferflux.security.replication import (
    REDIS_ERRORS,
    DocumentSync,
    LockedDocument,
    SnapshotError,
    SyncedChanges,
    SyncStatus,
    redis_document_sync,
)

MAX_ATTEMPTS = 5


class _ConfigDocument(LockedDocument):
    """`ReplicatedDocument` over a `LiveConfig`: its live values at a version."""

    label = "live config"

    def __init__(self, live: LiveConfig) -> None:
        super().__init__()
        self.live = live
        self.version = 0

    def held_version(self) -> int:
        return self.version

    def sealed(self) -> bytes:
        return _encode(self.live.live_values(), self.version)

    async def install(self, blob: bytes, version: int) -> bool:
        if version <= self.version:
            return False
        values = _decode(blob, version)
        try:
            await self.live.patch(_as_patch(values, self.live.live_values()))
        except InferfluxError as exc:
            raise SnapshotError(f"does not apply here: {exc.message}") from None
        self.version = version
        return True


class ConfigSync(SyncedChanges):
    """PATCH /v1/admin/config through the cluster (module docstring). `start` once on the
    event loop, `close` at shutdown."""

    def __init__(self, document: _ConfigDocument, sync: DocumentSync) -> None:
        super().__init__(sync)
        self._document = document

    def status(self) -> SyncStatus:
        return self._sync.status()

    async def patch(self, change: Mapping[str, Any]) -> dict[str, Any]:
        """`LiveConfig.patch`, published first. Raises what it raises (nothing changes
        then) or ServiceUnavailable (Redis unreachable, or other changes kept winning)."""
        document = self._document
        async with document.lock:
            for _ in range(MAX_ATTEMPTS):
                base = document.version
                blob = _encode(document.live.preview(change), base + 1)
                try:
                    newer = await self._sync.publish(blob, base, base + 1)
                except REDIS_ERRORS:
                    raise ServiceUnavailable(
                        "config replication unavailable (Redis cannot be reached); the "
                        "change was not applied, retry when it is back"
                    ) from None
                if newer is None:
                    document.version = base + 1
                    return await document.live.patch(change)
                if newer.blob is None:
                    break
                try:
                    await document.install(newer.blob, newer.version)
                except SnapshotError:
                    break
        raise ServiceUnavailable(
            "config replication: the cluster's newer config cannot be applied here or "
            "other changes kept landing first; the change was not applied"
        )


def _encode(values: Mapping[str, Any], version: int) -> bytes:
    return json.dumps({"version": version, "values": values}, sort_keys=True).encode()


def _decode(blob: bytes, version: int) -> dict[str, Any]:
    try:
        document = json.loads(blob)
    except ValueError:
        raise SnapshotError("not JSON") from None
    if not isinstance(document, dict) or document.get("version") != version:
        raise SnapshotError(f"not a live config snapshot of version {version}")
    values = document.get("values")
    if not isinstance(values, dict) or not set(values) <= LIVE_KEYS:
        raise SnapshotError("holds keys that are not live settings here")
    return values


def _as_patch(values: Mapping[str, Any], held: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted values → a nested PATCH body. A map value (`observability.tenant_logging`,
    whose entries a PATCH merges) also sets to null the entries held but absent."""
    patch: dict[str, Any] = {}
    for key, value in values.items():
        *sections, name = key.split(".")
        target = patch
        for section in sections:
            target = target.setdefault(section, {})
        held_map = held.get(key)
        if isinstance(value, dict) and isinstance(held_map, dict):
            target[name] = {**dict.fromkeys(held_map), **value}
        else:
            target[name] = value
    return patch


def make_config_sync(redis: RedisSettings, live: LiveConfig) -> ConfigSync | None:
    """The replication of `live` (None without `redis.url` or with `redis.config_sync`
    off)."""
    if redis.url is None or not redis.config_sync:
        return None
    document = _ConfigDocument(live)
    sync = redis_document_sync(document, redis, ":config")
    return ConfigSync(document, sync)
