"""`Periodic`: one asyncio task that runs a coroutine every interval, from `start` until
`stop` (the router's health checks and its DNS discovery)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class Periodic:
    """Runs `tick()` every `interval_s()` seconds (read each round, so a changed setting
    applies at the next one). `tick` handles its own errors."""

    def __init__(
        self, name: str, interval_s: Callable[[], float], tick: Callable[[], Awaitable[None]]
    ) -> None:
        self._name = name
        self._interval_s = interval_s
        self._tick = tick
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s())
            await self._tick()
