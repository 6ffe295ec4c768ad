"""`PolicySync`: policy replication across replicas through Redis (`redis.url` set).

The policy is one `DocumentSync` document (security/replication.py: the keys under
`redis.policy_namespace`, the compare-and-set publish, the follow loop with its periodic
catch-up, the re-seed of a Redis that lost its data). Its snapshot is the stored policy
sealed by `SnapshotCodec` (security/policy_codec.py: AES-GCM with a key derived from
`auth.policy_passphrase`, or plain JSON of key digests without one). `LivePolicy.update`
commits each admin change through `PolicySync.publish` and rebases it when another
replica got there first; `LivePolicy.apply` installs the others' versions (whole
snapshots, never an older version over a newer one). While Redis is unreachable an
admin change is refused with 503 `policy_unavailable` ("policy replication
unavailable"): applying it locally would let replicas diverge.

Owns the policy's document adapter and `make_policy_sync`. Does not own the policy
itself (`LivePolicy`) nor the snapshot format (policy_codec.py).
"""

from __future__ import annotations

import logging

from inferflux.config.security_settings import RedisSettings
from inferflux.errors import PolicyUnavailable
from inferflux.security.live_policy import LivePolicy
from inferflux.security.policy import Policy
from inferflux.security.policy_codec import DEFAULT_LOG2_N, SnapshotCodec
from inferflux.security.replication import (
    REDIS_ERRORS,
    DocumentSync,
    SnapshotError,
    SyncedChanges,
    SyncStatus,
    redis_document_sync,
)

logger = logging.getLogger(__name__)

PolicySyncStatus = SyncStatus  # what /server/stats and the metrics read


class _PolicyDocument:
    """`ReplicatedDocument` over a `LivePolicy`: its stored part, sealed."""

    label = "policy"

    def __init__(self, live: LivePolicy, codec: SnapshotCodec) -> None:
        self._live = live
        self._codec = codec

    def held_version(self) -> int:
        return self._live.stored().version

    def sealed(self) -> bytes:
        return self._codec.seal(self._live.stored())

    async def apply(self, blob: bytes, version: int) -> bool:
        return await self._live.apply(self._codec.open(blob, version))


class PolicySync(SyncedChanges):
    """The policy's replication: `PolicyPublisher` for `LivePolicy.update`, and the
    follower of the other replicas' changes. `start` once on the event loop, `close` at
    shutdown."""

    def __init__(self, live: LivePolicy, codec: SnapshotCodec, sync: DocumentSync) -> None:
        super().__init__(sync)
        self._live = live
        self._codec = codec

    def status(self) -> SyncStatus:
        return self._sync.status()

    async def publish(self, policy: Policy, base_version: int) -> Policy | None:
        """`PolicyPublisher.publish`: compare and set in Redis."""
        try:
            newer = await self._sync.publish(self._codec.seal(policy), base_version, policy.version)
        except REDIS_ERRORS:
            raise PolicyUnavailable(
                "policy replication unavailable (Redis cannot be reached); the change was "
                "not applied, retry when it is back"
            ) from None
        if newer is None:
            return None
        try:
            cluster = self._codec.open(newer.blob, newer.version) if newer.blob else None
        except SnapshotError:
            cluster = None
        if cluster is None or cluster.version <= base_version:
            raise PolicyUnavailable(
                f"policy replication: Redis holds version {newer.version} but no readable "
                "snapshot of it; the change was not applied"
            )
        return cluster


def make_policy_sync(
    redis: RedisSettings,
    live: LivePolicy,
    passphrase: str | None,
    *,
    log2_n: int | None = None,
) -> PolicySync | None:
    """The replication of `live` (None without `redis.url` or with `redis.policy_sync`
    off), attached to it. Derives the snapshot key from `passphrase` (blocks ~0.5 s)."""
    if redis.url is None or not redis.policy_sync:
        return None
    codec = SnapshotCodec(redis.policy_namespace, passphrase, log2_n=log2_n or DEFAULT_LOG2_N)
    if not codec.sealed:
        logger.warning(
            "policy replication stores the policy in Redis unencrypted and unauthenticated "
            "(key digests only, no secret): anyone who can write to Redis can change it. "
            "Set INFERFLUX_POLICY_PASSPHRASE (the same on every replica) to seal it"
        )
    sync = redis_document_sync(_PolicyDocument(live, codec), redis)
    policy_sync = PolicySync(live, codec, sync)
    live.attach(policy_sync)
    return policy_sync
