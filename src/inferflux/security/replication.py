"""`DocumentSync`: one versioned document replicated across replicas through Redis (the
security policy: security/policy_sync.py; the live config: api/config_sync.py; the
models loaded through the admin API: api/model_sync.py).

Keys, under a namespace (`<ns>` below):
- `<ns>:version`: the cluster's version of the document, an integer that only rises;
- `<ns>:snapshot`: that version's bytes (the document decides their format);
- `<ns>:published_at`: when it was published (Redis `TIME`, µs), for the lag gauge;
- channel `<ns>:changes`: each new version number, published as it is set.

Publishing is one Lua script, atomic in Redis: it sets all three keys and publishes the
version only if the cluster holds no version above the publisher's base (compare and
set). A change made from a stale base is refused there; the caller then installs the
newer snapshot and makes its change again on it, so no replica's change is silently
erased. Versions are therefore decided by Redis, one at a time.

Following: one task per replica subscribes to the channel and, on a version above its
own, fetches the snapshot and hands it to the document (`ReplicatedDocument.apply`: whole
snapshots, never an older version over a newer one). Every `interval_s` it also reads the
version key (the backstop to pub/sub: a message missed during a network blip, a
subscription dropped, a Redis restart). A Redis that lost its data (restarted without
persistence) holds a lower version than the replicas: the first replica to notice
publishes its snapshot again (the highest version any replica holds wins). On any Redis
error the task logs once per outage, waits one interval and reconnects; the replica
keeps what it holds.

Owns the script, the keys and the follow loop. Does not own the documents (their bytes,
how they apply), nor the metrics (the app reads `status()` at scrape time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from inferflux.config.security_settings import RedisSettings
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
class SyncStatus:
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


class SnapshotError(Exception):
    """A snapshot a replica refuses: another passphrase, tampered, or not applicable."""


class Newer(NamedTuple):
    """The cluster's version when a publish lost the race, and its bytes (if any)."""

    version: int
    blob: bytes | None


class ReplicatedDocument(Protocol):
    """What one replica holds of a replicated document."""

    @property
    def label(self) -> str:
        """What it is, for logs ("policy", "live config")."""
        ...

    def held_version(self) -> int: ...

    def sealed(self) -> bytes:
        """The held version as the bytes published for it (to re-seed Redis)."""
        ...

    async def apply(self, blob: bytes, version: int) -> bool:
        """Install `blob` published as `version` if newer than the held one (else
        False). Raises SnapshotError when refused (nothing changes then)."""
        ...


class LockedDocument(ABC):
    """A document whose changes, local and replicated, are installed one at a time: `apply`
    (a follower's snapshot) takes `lock` and calls `install`; a local change holds `lock`
    itself and may call `install` for a newer snapshot before it retries."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()

    async def apply(self, blob: bytes, version: int) -> bool:
        async with self.lock:
            return await self.install(blob, version)

    @abstractmethod
    async def install(self, blob: bytes, version: int) -> bool:
        """`apply` with the lock held."""


class SyncedChanges:
    """The part every replicated change source shares (the policy's, the live config's,
    the models'): its `DocumentSync`, started once on the event loop, closed at shutdown."""

    def __init__(self, sync: DocumentSync) -> None:
        self._sync = sync

    async def start(self) -> None:
        await self._sync.start()

    async def close(self) -> None:
        await self._sync.close()


def document_label(document: ReplicatedDocument) -> str:
    return document.label


class DocumentSync:
    """Publishes this replica's versions of `document` and follows the others' (module
    docstring). `start` once on the event loop, `close` at shutdown."""

    def __init__(
        self,
        document: ReplicatedDocument,
        client: Redis,
        *,
        namespace: str,
        interval_s: float,
        timeout_s: float,
        where: str,
    ) -> None:
        self._document = document
        self._client = client
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

    def status(self) -> SyncStatus:
        return SyncStatus(
            version=self._document.held_version(),
            redis_up=self._redis_up,
            applied_at=self._applied_at,
            lag_s=self._lag_s,
            **self._counts,
        )

    async def start(self) -> None:
        """Catch up with the cluster once (bounded by the Redis timeout: a Redis that is
        down only delays replication, never the start), then follow it in a task."""
        try:
            await self._catch_up()
        except REDIS_ERRORS as exc:
            self._on_failure(exc)
        self._task = asyncio.create_task(self._run(), name=f"{document_label(self._document)}-sync")

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

    async def publish(self, blob: bytes, base_version: int, version: int) -> Newer | None:
        """Make `blob` the cluster's `version` if the cluster holds no version above
        `base_version` (compare and set). None when published; else the cluster's newer
        version and its bytes (None when it has none). Raises a Redis error (logged as an
        outage) when Redis cannot answer: nothing was published then."""
        keys = [self._keys.version, self._keys.snapshot, self._keys.published_at]
        args: list[bytes | str | int] = [base_version, version, blob, self._keys.channel]
        try:
            published, current = await self._call(self._publish(keys=keys, args=args))
            if published:
                self._on_success()
                self._applied_at = time.time()
                return None
            # NOTE: read together: the snapshot may be newer still than `current`
            keys = [self._keys.version, self._keys.snapshot]
            newer_version, newer_blob = await self._call(self._client.mget(keys))
        except REDIS_ERRORS as exc:
            # NOTE: a reply lost after the script ran (a timeout) leaves the change
            # published: the caller reports a failure, and this replica applies the
            # version from the channel like any other.
            self._on_failure(exc)
            raise
        self._counts["conflicts"] += 1
        if newer_version is None:  # deleted since: report what the script saw
            return Newer(int(current), None)
        return Newer(int(newer_version), _as_bytes(newer_blob))

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
                logger.exception(
                    "%s replication: unexpected error; retrying", document_label(self._document)
                )
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await self._call(pubsub.aclose())  # type: ignore[no-untyped-call]
            if not self._closed:
                await asyncio.sleep(self._interval_s)

    async def _follow(self, pubsub: PubSub) -> None:
        """Subscribe, catch up, then apply each announced version, checking the version
        key every interval as well. Returns only by raising (a Redis error)."""
        await self._call(pubsub.subscribe(self._keys.channel))
        await self._catch_up()
        self._on_success()
        next_check = time.monotonic() + self._interval_s
        while True:
            wait_s = max(0.0, next_check - time.monotonic())
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait_s)
            announced = _announced(message)
            if announced is not None and announced > self._document.held_version():
                await self._pull(caught_up=False)
            if time.monotonic() >= next_check:
                await self._catch_up()
                next_check = time.monotonic() + self._interval_s

    async def _catch_up(self) -> None:
        """Compare the cluster's version with ours: pull a newer one, or publish ours
        again when Redis holds an older one (it lost its data). Each Redis call is bounded;
        applying a snapshot is not (loading a model takes seconds)."""
        raw = await self._call(self._client.get(self._keys.version))
        cluster = int(raw) if raw is not None else 0
        held = self._document.held_version()
        if cluster > held:
            await self._pull(caught_up=True)
        elif cluster < held:
            await self._reseed(held, cluster)

    async def _reseed(self, held: int, cluster: int) -> None:
        keys = [self._keys.version, self._keys.snapshot, self._keys.published_at]
        blob = self._document.sealed()
        args: list[bytes | str | int] = [held, held, blob, self._keys.channel]
        published, _ = await self._call(self._publish(keys=keys, args=args))
        if published:
            logger.warning(
                "%s replication: Redis held version %d, below this replica's %d (Redis "
                "lost its data?); published version %d again",
                document_label(self._document), cluster, held, held,
            )  # fmt: skip

    async def _pull(self, *, caught_up: bool) -> None:
        """Apply the cluster's snapshot when it is newer than ours; a snapshot the
        document refuses is counted and logged once per version."""
        keys = (self._keys.version, self._keys.snapshot, self._keys.published_at)
        raw_version, blob, published_us = await self._call(self._client.mget(keys))
        if raw_version is None or blob is None:
            return
        version = int(raw_version)
        try:
            applied = await self._document.apply(_as_bytes(blob) or b"", version)
        except SnapshotError as exc:
            if version != self._rejected_version:
                self._rejected_version = version
                self._counts["rejected"] += 1
                logger.error(
                    "%s replication: the snapshot of version %d in Redis is refused (%s); "
                    "keeping version %d", document_label(self._document), version, exc,
                    self._document.held_version(),
                )  # fmt: skip
            return
        if not applied:
            return
        now = time.time()
        self._applied_at = now
        published_at = int(published_us) / 1e6 if published_us is not None else None
        self._lag_s = None if published_at is None else max(0.0, now - published_at)
        if caught_up:
            self._counts["catch_ups"] += 1
        logger.info(
            "%s version %d applied from the cluster (%s)",
            document_label(self._document), version,
            "periodic check" if caught_up else "change notice",
        )  # fmt: skip

    async def _call(self, awaitable: Awaitable[T]) -> T:
        # NOTE: socket timeouts bound each read; this bounds the whole call.
        async with asyncio.timeout(self._timeout_s * 4):
            return await awaitable

    def _on_failure(self, exc: BaseException) -> None:
        if self._redis_up:
            logger.warning(
                "%s replication: Redis at %s cannot be reached (%s); serving the version "
                "held (%d), admin changes are refused until it answers again",
                document_label(self._document), self._where, type(exc).__name__,
                self._document.held_version(),
            )  # fmt: skip
        self._redis_up = False

    def _on_success(self) -> None:
        if not self._redis_up:
            logger.warning(
                "%s replication: Redis at %s answers again (version %d)",
                document_label(self._document), self._where, self._document.held_version(),
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


def _as_bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def redis_client(redis: RedisSettings) -> Any:  # Any: redis-py's from_url is untyped
    """The client replication uses: `redis.timeout_s` per call, no retries (the follow
    loop reconnects after an interval). `redis.url` must be set."""
    assert redis.url is not None  # NOTE: callers check it
    return Redis.from_url(
        redis.url.get_secret_value(),
        socket_timeout=redis.timeout_s,
        socket_connect_timeout=redis.timeout_s,
        retry_on_timeout=False,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


def redis_document_sync(
    document: ReplicatedDocument, redis: RedisSettings, suffix: str = ""
) -> DocumentSync:
    """`document` replicated through `redis.url` under `redis.policy_namespace` (+ `suffix`:
    ":config", ":models"), checked every `redis.policy_sync_interval_s`."""
    assert redis.url is not None  # NOTE: callers check it
    return DocumentSync(
        document,
        redis_client(redis),
        namespace=f"{redis.policy_namespace}{suffix}",
        interval_s=redis.policy_sync_interval_s,
        timeout_s=redis.timeout_s,
        where=redis_location(redis.url.get_secret_value()),
    )
