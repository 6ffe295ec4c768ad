"""Graceful shutdown of the API: `Drain` (the draining state), `DrainMiddleware` (new
requests get 503 + Retry-After while draining) and `drain_then_stop` (the sequence
`inferflux serve` runs on SIGTERM).

On SIGTERM: /readyz turns 503 at once and every new HTTP request (probes and /metrics
aside) gets 503 `shutting_down` with Retry-After, in its dialect's error shape; requests
already open go on for up to `server.shutdown_grace_s`. The ones still open then are cut:
each generation is aborted in the engine and its stream ends with the dialect's error
frame and end frames (OpenAI: an error event, then `data: [DONE]`); a collected
(non-streamed) one answers 503. Then the server stops: workers exit, exit code 0.

Does not own: the signal handling (cli/serve.py) nor the frames (each renderer).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from inferflux.api.errors import error_response
from inferflux.errors import ShuttingDown

logger = logging.getLogger(__name__)

# Paths a draining server still answers: the probes (/readyz says 503 itself) and metrics.
_ALWAYS_SERVED = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})
_POLL_S = 0.02
CUT_FLUSH_S = 0.25  # after the cut: time for the cut streams to send their last frames
# The last part of the grace is for stopping: uvicorn (0.2 s), the workers (up to 1 s,
# engine/worker_pool.py SHUTDOWN_JOIN_S) and the interpreter's own exit (0.5 s here). The cut
# comes this long before server.shutdown_grace_s ends (at most half of it).
STOP_RESERVE_S = 1.5
REFUSED = "the server is shutting down; retry on another replica"
CUT = (
    "the server is shutting down: this request was still running when "
    "server.shutdown_grace_s ran out; retry on another replica"
)


class Abortable(Protocol):
    """A generation the drain can cut (`Generation`)."""

    async def abort(self) -> None:
        """Abort every unfinished request of the generation in the engine."""
        ...


class Drain:
    """Whether the server is draining, the HTTP requests still open, and the live
    generations to cut when the grace period ends. One per app (`GenerationService`)."""

    def __init__(self) -> None:
        self._draining = False
        self._cut = False
        self._open = 0
        self._generations: weakref.WeakSet[Abortable] = weakref.WeakSet()

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def cut(self) -> bool:
        """True once the grace period ran out: open generations end as shutting down."""
        return self._cut

    @property
    def open_requests(self) -> int:
        return self._open

    def begin(self) -> None:
        self._draining = True

    def opened(self) -> None:
        self._open += 1

    def closed(self) -> None:
        self._open -= 1

    def track(self, generation: Abortable) -> None:
        """Remember a live generation (weakly: a closed one is forgotten with it)."""
        self._generations.add(generation)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no HTTP request is open (True) or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while self._open > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S)
        return True

    async def cut_all(self) -> int:
        """Abort every live generation; each then ends as shutting down. Returns how many
        were live."""
        self._cut = True
        generations = list(self._generations)
        for generation in generations:
            await generation.abort()
        return len(generations)


async def drain_then_stop(drain: Drain, grace_s: float, stop: Callable[[], None]) -> None:
    """Drain (new requests 503), let open requests run until `STOP_RESERVE_S` before
    `grace_s` ends, cut the rest, give them up to `CUT_FLUSH_S` to send their last
    frames, then `stop()` the server."""
    drain.begin()
    logger.info(
        "shutting down: draining %d open request(s), grace %.1f s (server.shutdown_grace_s)",
        drain.open_requests,
        grace_s,
    )
    if not await drain.wait_idle(grace_s - min(STOP_RESERVE_S, grace_s / 2)):
        cut = await drain.cut_all()
        logger.warning(
            "shutdown grace ran out: %d request(s) still open, %d generation(s) cut",
            drain.open_requests,
            cut,
        )
        await drain.wait_idle(CUT_FLUSH_S)
    stop()


class DrainMiddleware:
    """Counts open HTTP requests for the drain; while draining, answers every new one
    (but the probes and /metrics) with 503 `shutting_down` + Retry-After."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in _ALWAYS_SERVED:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await error_response(ShuttingDown(REFUSED), path)(scope, receive, send)
            return
        self.drain.opened()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.closed()
