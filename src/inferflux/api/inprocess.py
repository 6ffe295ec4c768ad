"""In-process HTTP requests through the whole app, for frontends that are not HTTP.

A WebSocket message (or an RPC) that asks for a generation is served as one HTTP request
to the app's own route, sent through the app's entire middleware stack: request id,
telemetry, audit, authentication, rate limits, the body-size limit and the route's scope
dependency apply to it exactly as to a request from the network, so such a frontend
cannot skip a control. Owns `InProcessRequest` and `dispatch`: the exchange's status and
headers, then its body chunks as they are sent; leaving `dispatch` early tells the app
the client went away (`http.disconnect`, which aborts a generation) and waits for it to
finish.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message

_QUEUE_SIZE = 64  # body chunks buffered before the app's `send` waits for the reader
_GRACE_S = 5.0  # how long a disconnected app may take to end before it is cancelled


@dataclass(slots=True)
class InProcessRequest:
    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    client: tuple[str, int] | None = None
    extensions: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class InProcessExchange:
    """The response as it comes: `status` and `headers` once started, then `chunks()`."""

    status: int
    headers: list[tuple[bytes, bytes]]
    _messages: asyncio.Queue[Message | None]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk, as the app sends it."""
        while (message := await self._messages.get()) is not None:
            if message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    return

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])


def _scope(request: InProcessRequest) -> dict[str, object]:
    headers = [(k.lower(), v) for k, v in request.headers if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(request.body)).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": request.client,
        "server": None,
        "extensions": dict(request.extensions),
        "state": {},
    }


@contextlib.asynccontextmanager
async def dispatch(app: ASGIApp, request: InProcessRequest) -> AsyncIterator[InProcessExchange]:
    """Send `request` through `app`; yields once the response started. Raises whatever
    the app raised before it started a response (it never does: errors are responses)."""
    messages: asyncio.Queue[Message | None] = asyncio.Queue(_QUEUE_SIZE)
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if disconnected.is_set():
            raise OSError("the in-process client went away")
        await messages.put(message)

    async def run() -> None:
        try:
            await app(_scope(request), receive, send)
        finally:
            with contextlib.suppress(asyncio.QueueFull):
                messages.put_nowait(None)

    task = asyncio.create_task(run(), name=f"inprocess {request.path}")
    try:
        start = await messages.get()
        if start is None:
            await asyncio.wait({task})
            task.result()  # re-raise the app's failure
            raise RuntimeError("the app ended without a response")
        exchange = InProcessExchange(start["status"], list(start.get("headers", [])), messages)
        yield exchange
    finally:
        disconnected.set()
        await _finish(task, messages)


async def _finish(task: asyncio.Task[None], messages: asyncio.Queue[Message | None]) -> None:
    """Let the app see the disconnect and end (draining what it still sends), then cancel
    it if it has not within the grace period."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _GRACE_S
    while not task.done() and loop.time() < deadline:
        while not messages.empty():
            messages.get_nowait()
        await asyncio.wait({task}, timeout=0.05)
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
