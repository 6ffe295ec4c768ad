"""`PolicySync`: policy replication across replicas through Redis (`redis.url` set).

Keys, under `redis.policy_namespace` (`<ns>` below):
- `<ns>:version`: the cluster's policy version, an integer that only rises;
- `<ns>:snapshot`: that version's policy (security/policy_codec.py: AES-GCM sealed with a
  key derived from `auth.policy_passphrase`, or plain JSON of key digests without one);
- `<ns>:published_at`: when it was published (Redis `TIME`, µs), for the lag gauge;
- channel `<ns>:changes`: each new version number, published as it is set.

Publishing is one Lua script, atomic in Redis: it sets all three keys and publishes the
version only if the cluster holds no version above the publisher's base (compare and
set). An admin change made from a stale base is refused there; `LivePolicy.update` then
installs the newer snapshot and runs the change again on it, so no replica's change is
silently erased. Versions are therefore decided by Redis, one at a time.

Following: one task per replica subscribes to the channel and, on a version above its
own, fetches the snapshot and applies it (`LivePolicy.apply`: whole snapshots, never an
older version over a newer one). Every `redis.policy_sync_interval_s` it also reads the
version key (the backstop to pub/sub: a message missed during a network blip, a
subscription dropped, a Redis restart). A Redis that lost its data (restarted without
persistence) holds a lower version than the replicas: the first replica to notice
publishes its snapshot again (the highest version any replica holds wins). On any
Redis error the task logs once per outage, waits one interval and reconnects; the
replica keeps serving with the policy it has. While Redis is unreachable an admin change
is refused with 503 `policy_unavailable` ("policy replication unavailable"): applying it
locally would let replicas diverge.

Owns the scripts, the keys and the follow loop. Does not own the policy itself
(`LivePolicy`), the snapshot format (policy_codec.py), nor the metrics (the app reads
`status()` at scrape time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from inferflux.config.security_settings import RedisSettings
from inferflux.errors import PolicyUnavailable
from inferflux.security.live_policy import LivePolicy
from inferflux.security.policy import Policy
from inferflux.security.policy_codec import DEFAULT_LOG2_N, SnapshotCodec, SnapshotError
from inferflux.security.rate_limit.limiter import redis_location

logger = logging.getLogger(__name__)

T = TypeVar("T")
REDIS_ERRORS = (RedisError, OSError, TimeoutError)

# KEYS: version, snapshot, published_at. ARGV: base version, new version, snapshot, channel.
# Sets all three and publishes iff the cluster's version <= base and < new.
# Returns {1 if published else 0, the cluster's version before}.
_PUBLISH = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local base = tonumber(ARGV[1])
local new = tonumber(ARGV[2])
if current > base or new <= current then
  return {0, current}
end
local t = redis.call('TIME')
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], t[1] .. string.format('%06d', tonumber(t[2])))
redis.call('PUBLISH', ARGV[4], ARGV[2])
return {1, current}
"""


@dataclass(frozen=True, slots=True)
class PolicySyncStatus:
    """What `/server/stats` and the metrics show. `lag_s`: from publish (Redis clock) to
    apply here, of the last version this replica applied from another replica."""

    version: int
    redis_up: bool
    applied_at: float | None  # Unix time the running version was applied or published
    lag_s: float | None
    catch_ups: int  # versions applied from the periodic check, not from a message
    conflicts: int  # changes of this replica rebased on another replica's newer version
    rejected: int  # versions whose snapshot did not decode (another passphrase, tampered)


class _Keys:
    def __init__(self, namespace: str) -> None:
        self.version = f"{namespace}:version"
        self.snapshot = f"{namespace}:snapshot"
        self.published_at = f"{namespace}:published_at"
        self.channel = f"{namespace}:changes"


class PolicySync:
    """Publishes this replica's changes and follows the others' (module docstring).
    `start` once on the event loop, `close` at shutdown."""

    def __init__(
        self,
        live: LivePolicy,
        client: Redis,
        codec: SnapshotCodec,
        *,
        namespace: str,
        interval_s: float,
        timeout_s: float,
        where: str,
    ) -> None:
        self._live = live
        self._client = client
        self._codec = codec
        self._keys = _Keys(namespace)
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._where = where
        self._publish = client.register_script(_PUBLISH)
        self._task: asyncio.Task[None] | None = None
        self._redis_up = True
        self._applied_at: float | None = None
        self._lag_s: float | None = None
        self._counts = {"catch_ups": 0, "conflicts": 0, "rejected": 0}
        self._rejected_version: int | None = None
        self._closed = False

    def status(self) -> PolicySyncStatus:
        return PolicySyncStatus(
            version=self._live.stored().version,
            redis_up=self._redis_up,
            applied_at=self._applied_at,
            lag_s=self._lag_s,
            **self._counts,
        )

    async def start(self) -> None:
        """Catch up with the cluster once (bounded by the Redis timeout: a Redis that is
        down only delays replication, never the start), then follow it in a task."""
        try:
            await self._call(self._catch_up())
        except REDIS_ERRORS as exc:
            self._on_failure(exc)
        self._task = asyncio.create_task(self._run(), name="policy-sync")

    async def close(self) -> None:
        """Stop following (bounded: a task that does not end within a few timeouts is
        left cancelled) and close the Redis connections."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(self._timeout_s * 8):
                    await self._task
        with contextlib.suppress(*REDIS_ERRORS):
            await self._call(self._client.aclose())

    async def publish(self, policy: Policy, base_version: int) -> Policy | None:
        """`PolicyPublisher.publish`: compare and set in Redis (module docstring)."""
        blob = self._codec.seal(policy)
        keys = [self._keys.version, self._keys.snapshot, self._keys.published_at]
        args: list[bytes | str | int] = [base_version, policy.version, blob, self._keys.channel]
        try:
            published, current = await self._call(self._publish(keys=keys, args=args))
            if published:
                self._on_success()
                self._applied_at = time.time()
                return None
            newer = await self._call(self._fetch())
        except REDIS_ERRORS as exc:
            # NOTE: a reply lost after the script ran (a timeout) leaves the change
            # published: the caller gets a 503, and this replica applies the version
            # from the channel like any other.
            self._on_failure(exc)
            raise PolicyUnavailable(
                "policy replication unavailable (Redis cannot be reached); the change was "
                "not applied, retry when it is back"
            ) from None
        self._counts["conflicts"] += 1
        if newer is None or newer[0].version <= base_version:
            raise PolicyUnavailable(
                f"policy replication: Redis holds version {current} but no readable "
                "snapshot of it; the change was not applied"
            )
        return newer[0]

    async def _run(self) -> None:
        # NOTE: `_closed` ends the loop even if a cancel were turned into a TimeoutError
        # by a `_call` timeout expiring at the same moment.
        while not self._closed:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await self._follow(pubsub)
            except REDIS_ERRORS as exc:
                self._on_failure(exc)
            except Exception:  # a bug must not end replication silently
                logger.exception("policy replication: unexpected error; retrying")
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await self._call(pubsub.aclose())  # type: ignore[no-untyped-call]
            if not self._closed:
                await asyncio.sleep(self._interval_s)

    async def _follow(self, pubsub: PubSub) -> None:
        """Subscribe, catch up, then apply each announced version, checking the version
        key every interval as well. Returns only by raising (a Redis error)."""
        await self._call(pubsub.subscribe(self._keys.channel))
        await self._call(self._catch_up())
        self._on_success()
        next_check = time.monotonic() + self._interval_s
        while True:
            wait_s = max(0.0, next_check - time.monotonic())
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait_s)
            announced = _announced(message)
            if announced is not None and announced > self._live.stored().version:
                await self._call(self._pull(caught_up=False))
            if time.monotonic() >= next_check:
                await self._call(self._catch_up())
                next_check = time.monotonic() + self._interval_s

    async def _catch_up(self) -> None:
        """Compare the cluster's version with ours: pull a newer one, or publish ours
        again when Redis holds an older one (it lost its data)."""
        raw = await self._client.get(self._keys.version)
        cluster = int(raw) if raw is not None else 0
        held = self._live.stored()
        if cluster > held.version:
            await self._pull(caught_up=True)
        elif cluster < held.version:
            await self._reseed(held, cluster)

    async def _reseed(self, held: Policy, cluster: int) -> None:
        keys = [self._keys.version, self._keys.snapshot, self._keys.published_at]
        blob = self._codec.seal(held)
        args: list[bytes | str | int] = [held.version, held.version, blob, self._keys.channel]
        published, _ = await self._publish(keys=keys, args=args)
        if published:
            logger.warning(
                "policy replication: Redis held version %d, below this replica's %d (Redis "
                "lost its data?); published version %d again", cluster, held.version,
                held.version,
            )  # fmt: skip

    async def _pull(self, *, caught_up: bool) -> None:
        fetched = await self._fetch()
        if fetched is None:
            return
        policy, published_at = fetched
        if not await self._live.apply(policy):
            return
        now = time.time()
        self._applied_at = now
        self._lag_s = None if published_at is None else max(0.0, now - published_at)
        if caught_up:
            self._counts["catch_ups"] += 1
        logger.info(
            "policy version %d applied from the cluster (%s)",
            policy.version,
            "periodic check" if caught_up else "change notice",
        )

    async def _fetch(self) -> tuple[Policy, float | None] | None:
        """The cluster's snapshot and its publish time; None when there is none or it
        does not decode (counted and logged)."""
        keys = (self._keys.version, self._keys.snapshot, self._keys.published_at)
        version, blob, published_us = await self._client.mget(keys)
        if version is None or blob is None:
            return None
        try:
            policy = self._codec.open(
                blob if isinstance(blob, bytes) else blob.encode(), int(version)
            )
        except SnapshotError as exc:
            if int(version) != self._rejected_version:  # once per version, not per check
                self._rejected_version = int(version)
                self._counts["rejected"] += 1
                logger.error(
                    "policy replication: the snapshot of version %s in Redis is refused "
                    "(%s); keeping version %d", int(version), exc, self._live.stored().version,
                )  # fmt: skip
            return None
        published_at = int(published_us) / 1e6 if published_us is not None else None
        return policy, published_at

    async def _call(self, awaitable: Awaitable[T]) -> T:
        # NOTE: socket timeouts bound each read; this bounds the whole call.
        async with asyncio.timeout(self._timeout_s * 4):
            return await awaitable

    def _on_failure(self, exc: BaseException) -> None:
        if self._redis_up:
            logger.warning(
                "policy replication: Redis at %s cannot be reached (%s); serving the policy "
                "held (version %d), admin changes are refused until it answers again",
                self._where, type(exc).__name__, self._live.stored().version,
            )  # fmt: skip
        self._redis_up = False

    def _on_success(self) -> None:
        if not self._redis_up:
            logger.warning(
                "policy replication: Redis at %s answers again (version %d)",
                self._where, self._live.stored().version,
            )  # fmt: skip
        self._redis_up = True


def _announced(message: dict[str, Any] | None) -> int | None:
    """The version a channel message announces (None: not a version message)."""
    if message is None or message.get("type") != "message":
        return None
    try:
        return int(message["data"])
    except (TypeError, ValueError):
        return None


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
    url = redis.url.get_secret_value()
    client: Any = Redis.from_url(  # Any: redis-py's from_url is untyped
        url,
        socket_timeout=redis.timeout_s,
        socket_connect_timeout=redis.timeout_s,
        retry_on_timeout=False,
        retry=Retry(NoBackoff(), 0),  # one try: the loop reconnects after an interval
        health_check_interval=0,
    )
    codec = SnapshotCodec(redis.policy_namespace, passphrase, log2_n=log2_n or DEFAULT_LOG2_N)
    if not codec.sealed:
        logger.warning(
            "policy replication stores the policy in Redis unencrypted and unauthenticated "
            "(key digests only, no secret): anyone who can write to Redis can change it. "
            "Set INFERFLUX_POLICY_PASSPHRASE (the same on every replica) to seal it"
        )
    sync = PolicySync(
        live,
        client,
        codec,
        namespace=redis.policy_namespace,
        interval_s=redis.policy_sync_interval_s,
        timeout_s=redis.timeout_s,
        where=redis_location(url),
    )
    live.attach(sync)
    return sync
