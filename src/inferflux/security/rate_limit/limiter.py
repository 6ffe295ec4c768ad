"""The `RateLimiter` seam, its factory, and what happens when Redis fails.

`make_rate_limiter(settings)`: a `LocalLimiter` (in-memory, one replica) without
`redis.url`; with it, a `FailoverLimiter` over a `RedisLimiter`. When Redis cannot answer
within `redis.timeout_s`, `FailoverLimiter` applies `rate_limit.redis_failure_mode`:
`local` (decide in this replica's memory), `open` (allow) or `closed` (503
policy_unavailable). It logs once when an outage starts and once when it ends, counts
every decision taken without Redis, and skips Redis for `redis.retry_after_s` after a
failure, so an outage costs one timeout per retry interval, never one per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from inferflux.config.security_settings import RateLimitSettings, RedisSettings
from inferflux.errors import PolicyUnavailable
from inferflux.security.rate_limit.gcra import Charge, Decision, LocalLimiter, RateState, Slot
from inferflux.security.rate_limit.redis_limiter import RedisLimiter

logger = logging.getLogger(__name__)

T = TypeVar("T")

FailureMode = Literal["local", "open", "closed"]


class RateLimiter(Protocol):
    """Where rate-limit state lives. Every method is atomic per call."""

    async def acquire(
        self, charges: Sequence[Charge], slots: Sequence[Slot], member: str
    ) -> Decision:
        """Charge all `charges` and take all `slots` (for `member`), or none of them."""
        ...

    async def charge(self, charges: Sequence[Charge]) -> tuple[RateState, ...]:
        """Charge without checking (units already spent); the key may go into debt."""
        ...

    async def release(self, slots: Sequence[Slot], member: str) -> None:
        """Give back `member`'s slots (unknown ones are ignored)."""
        ...

    async def close(self) -> None: ...


class LimiterEvents(Protocol):
    """What the failover reports (the metrics exporter implements it)."""

    def on_redis_failure(self) -> None: ...

    def on_fallback_decision(self, mode: str) -> None: ...

    def on_redis_up(self, up: bool) -> None: ...


class FailoverLimiter:
    """Redis first; `mode` while Redis is unreachable (see the module docstring)."""

    def __init__(
        self,
        redis: RateLimiter,
        *,
        mode: FailureMode,
        timeout_s: float,
        retry_after_s: float,
        where: str,
        events: LimiterEvents | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = redis
        self.local = LocalLimiter(clock=clock)
        self.mode = mode
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        self._where = where
        self._events = events
        self._clock = clock
        self._down_until: float | None = None  # set during an outage

    async def acquire(
        self, charges: Sequence[Charge], slots: Sequence[Slot], member: str
    ) -> Decision:
        if self._redis_usable():
            try:
                decision = await self._call(self.redis.acquire(charges, slots, member))
            except (RedisError, OSError, TimeoutError) as exc:
                self._on_failure(exc)
            else:
                self._on_success()
                return decision
        self._count_fallback()
        if self.mode == "local":
            return self.local.acquire_now(charges, slots, member)
        if self.mode == "open":
            return Decision(True)
        raise PolicyUnavailable(
            "rate limits cannot be checked (the shared rate-limit store is unreachable); "
            "retry shortly"
        )

    async def charge(self, charges: Sequence[Charge]) -> tuple[RateState, ...]:
        if self._redis_usable():
            try:
                states = await self._call(self.redis.charge(charges))
            except (RedisError, OSError, TimeoutError) as exc:
                self._on_failure(exc)
            else:
                self._on_success()
                return states
        if self.mode == "local":
            return await self.local.charge(charges)
        return ()

    async def release(self, slots: Sequence[Slot], member: str) -> None:
        """Release where the slots were taken; a failed Redis release is left to the
        slot's lease expiry."""
        await self.local.release(slots, member)
        if self._redis_usable():
            try:
                await self._call(self.redis.release(slots, member))
            except (RedisError, OSError, TimeoutError) as exc:
                self._on_failure(exc)

    async def close(self) -> None:
        try:
            await self._call(self.redis.close())
        except (RedisError, OSError, TimeoutError):
            logger.debug("closing the Redis connection failed; ignored at shutdown")

    async def _call(self, awaitable: Awaitable[T]) -> T:
        # NOTE: redis-py's socket timeouts bound each read and connect; this bounds the
        # whole call (a connection pool wait, a reconnect loop) as well.
        async with asyncio.timeout(self._timeout_s * 4):
            return await awaitable

    def _redis_usable(self) -> bool:
        return self._down_until is None or self._clock() >= self._down_until

    def _on_failure(self, exc: BaseException) -> None:
        if self._events is not None:
            self._events.on_redis_failure()
        if self._down_until is None:
            logger.warning(
                "Redis at %s is unreachable (%s); rate limits fall back to '%s' "
                "(rate_limit.redis_failure_mode) until it answers again",
                self._where,
                type(exc).__name__,
                self.mode,
            )
            if self._events is not None:
                self._events.on_redis_up(False)
        self._down_until = self._clock() + self._retry_after_s

    def _on_success(self) -> None:
        if self._down_until is not None:
            logger.warning("Redis at %s answers again; rate limits are shared again", self._where)
            self._down_until = None
            if self._events is not None:
                self._events.on_redis_up(True)

    def _count_fallback(self) -> None:
        if self._events is not None:
            self._events.on_fallback_decision(self.mode)


def redis_location(url: str) -> str:
    """`host:port` of a Redis URL, without credentials or database (safe to log)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or '?'}:{parts.port or 6379}"


def make_rate_limiter(
    redis: RedisSettings, rate_limit: RateLimitSettings, events: LimiterEvents | None = None
) -> RateLimiter:
    """In-memory without `redis.url`; else Redis with the configured failure mode."""
    if redis.url is None:
        return LocalLimiter()
    url = redis.url.get_secret_value()
    client = Redis.from_url(
        url,
        socket_timeout=redis.timeout_s,
        socket_connect_timeout=redis.timeout_s,
        retry_on_timeout=False,
        # NOTE: one retry, on a fresh connection, for a connection error only: after a
        # Redis restart each pooled connection to the old process fails once, and without
        # it every one of them restarted the fallback (`tests/chaos`, Redis restarted).
        # A timeout is not retried: a failure goes to the failure mode.
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        health_check_interval=0,
    )
    if events is not None:
        events.on_redis_up(True)
    return FailoverLimiter(
        RedisLimiter(client, lease_s=rate_limit.concurrency_lease_s),
        mode=rate_limit.redis_failure_mode,
        timeout_s=redis.timeout_s,
        retry_after_s=redis.retry_after_s,
        where=redis_location(url),
        events=events,
    )
