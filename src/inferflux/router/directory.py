"""The prefix-affinity directory shared through Redis by several routers.

Owns: `SharedDirectory`: for each prompt block hash, which replicas (by URL, so routers
that list the replicas in another order agree) were sent it, and whether a prompt ended
there (`inferflux:router:affinity:<hash>` → Redis hash {replica URL: "1" | "0"}, expiring
`redis_ttl_s` after its last write). A router looks a prompt's blocks up in one
pipelined round trip before it picks, and writes the blocks of the replica it picked in
the background. Does not own: the local index (`prefix_index.py`), which keeps working on
its own: a Redis that fails or is slow (`redis_timeout_s`) is skipped for
`_SKIP_AFTER_FAILURE_S`, and the router routes on what it knows itself.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from inferflux.config.router_settings import RouterSettings
from inferflux.router.prefix_index import PrefixMatch

logger = logging.getLogger(__name__)

KEY_PREFIX = "inferflux:router:affinity:"
_SKIP_AFTER_FAILURE_S = 2.0
_NO_MATCH = PrefixMatch(0, False)


class SharedDirectory:
    """Block → replicas in Redis. Methods run on the router's event loop."""

    def __init__(self, client: Redis, urls: list[str], ttl_s: float) -> None:
        self._client = client
        self._urls = [url.encode() for url in urls]
        self._ttl_s = max(1, int(ttl_s))
        self._skip_until = 0.0
        self._writes: set[asyncio.Task[None]] = set()

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> SharedDirectory | None:
        """None without `redis_url`."""
        if settings.redis_url is None:
            return None
        client = Redis.from_url(
            settings.redis_url.get_secret_value(),
            socket_timeout=settings.redis_timeout_s,
            socket_connect_timeout=settings.redis_timeout_s,
            retry_on_timeout=False,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        return cls(client, settings.replicas, settings.redis_ttl_s)

    async def match(self, hashes: list[bytes]) -> list[PrefixMatch] | None:
        """Per replica (in this router's order), the leading blocks of `hashes` some
        router sent there. None when Redis is unavailable (then only the local index)."""
        if not hashes or time.monotonic() < self._skip_until:
            return None
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for block in hashes:
                    pipe.hgetall(KEY_PREFIX + block.hex())
                rows: list[dict[bytes, bytes]] = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        return [_longest(rows, url) for url in self._urls]

    def record(self, replica: int, hashes: list[bytes], end: int) -> None:
        """Write, in the background, that `hashes` went to `replica` (prompt end at
        block `end` and at the last block)."""
        if not hashes or time.monotonic() < self._skip_until:
            return
        task = asyncio.create_task(self._write(self._urls[replica], hashes, end))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def flush(self) -> None:
        """Wait for the writes in flight."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        await self._client.aclose()

    async def _write(self, url: bytes, hashes: list[bytes], end: int) -> None:
        last = len(hashes) - 1
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for i, block in enumerate(hashes):
                    key = KEY_PREFIX + block.hex()
                    if i in (end, last):
                        pipe.hset(key, url, b"1")
                    else:  # never turn another prompt's end mark into a plain block
                        pipe.hsetnx(key, url, b"0")
                    pipe.expire(key, self._ttl_s)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if time.monotonic() >= self._skip_until:
            logger.warning(
                "router.redis_url unavailable (%s): routing on the local index for %.0f s",
                type(exc).__name__,
                _SKIP_AFTER_FAILURE_S,
            )
        self._skip_until = time.monotonic() + _SKIP_AFTER_FAILURE_S


def _longest(rows: list[dict[bytes, bytes]], url: bytes) -> PrefixMatch:
    for i in range(len(rows) - 1, -1, -1):
        flag = rows[i].get(url)
        if flag is not None:
            return PrefixMatch(i + 1, flag == b"1")
    return _NO_MATCH
