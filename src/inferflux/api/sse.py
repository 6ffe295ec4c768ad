"""Server-sent events: framing, and a response that always closes its event source.

Owns: `sse_data` (one `data: <json>` event, JSON encoded with msgspec), `SSE_DONE`, the
error event, and `EventStreamResponse`. Does not own: what the events say (the OpenAI
routes build the chunks).

Why a response class of our own: Starlette's StreamingResponse, on a server speaking ASGI
spec 2.4, stops iterating when the client goes away but leaves the async generator
suspended until garbage collection, so the engine would keep generating for nobody.
`EventStreamResponse` watches for `http.disconnect` while it streams, cancels the stream
when it arrives, and always `aclose()`s the generator, whose `finally` aborts the request.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

import anyio
import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from inferflux.errors import InferfluxError

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

_encoder = msgspec.json.Encoder()


def sse_data(payload: object) -> bytes:
    """One SSE event carrying `payload` as JSON: `data: {...}\\n\\n`."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def sse_event(name: str, payload: object) -> bytes:
    """One named SSE event: `event: <name>\\ndata: {...}\\n\\n` (Anthropic's framing)."""
    return b"event: " + name.encode() + b"\ndata: " + _encoder.encode(payload) + b"\n\n"


def sse_error(exc: InferfluxError) -> bytes:
    """The event that reports a failure after the stream started (then send SSE_DONE)."""
    return sse_data(exc.to_body())


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response fed by an async generator of encoded events.

    The generator is closed (`aclose`) in every case: finished, failed, or client gone.
    """

    media_type = "text/event-stream"

    def __init__(
        self, events: AsyncGenerator[bytes, None], headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(events, headers={**SSE_HEADERS, **(headers or {})})
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(_cancel_on_disconnect, receive, task_group.cancel_scope)
                await self._stream(send)
                task_group.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # NOTE: only one task can fail at a time here; re-raise it bare.
            raise group.exceptions[0] from None
        finally:
            with anyio.CancelScope(shield=True):
                await self.events.aclose()

    async def _stream(self, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away (ASGI 2.4 servers raise from send)


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
