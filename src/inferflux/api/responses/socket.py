"""The Responses API's WebSocket mode: `GET /v1/responses` upgraded to a WebSocket.

A client keeps one connection for a chain of responses (a tool-call loop): it sends
`{"type": "response.create", ...}` messages whose other fields are a `POST /v1/responses`
body (`stream` and `background` are the transport's: every response streams), and gets
the same typed events back, one JSON text message each. Responses run one at a time, in
the order they were sent (at most `MAX_QUEUED` may wait: a client that sends more is
closed with 1008). A failure before a response starts is one `error` message
(`{"type": "error", "status", "error": {"type", "code", "message", "param"}}`), and the
connection stays open.

Each `response.create` is served as an in-process `POST /v1/responses` through the whole
app (`api/inprocess.py`) with the connection's credentials, so authentication, the
scope, rate limits, audit, guardrails and token limits apply to every message as to any
HTTP request. The connection keeps its last responses in a store of its own
(`CONNECTION_STORE`), so `previous_response_id` continues a chain on the socket even
with `store: false`. A client that goes away mid-response aborts its generation, as an
SSE client does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine

import msgspec
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from inferflux.api.inprocess import InProcessRequest, dispatch
from inferflux.api.response_store import ResponseStore
from inferflux.api.responses.routes import CONNECTION_STORE
from inferflux.api.state import app_state

router = APIRouter(tags=["responses"])

CONNECTION_RESPONSES = 16  # responses a connection keeps for its own chains
MAX_QUEUED = 32  # messages waiting behind the response in flight; more closes the socket
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Headers of the upgrade request that each in-process request carries on.
_CARRIED = {b"authorization", b"x-api-key", b"traceparent", b"tracestate", b"user-agent"}
_decoder = msgspec.json.Decoder()


class _Closed(Exception):
    """The client closed the connection."""


def _error(status: int, error: dict[str, object]) -> str:
    """An `error` message: the error's fields at the top (as the SDK's ResponseErrorEvent
    reads them) and as `error` with the HTTP status (as OpenAI's WebSocket sends them)."""
    top = {name: error.get(name) for name in ("code", "message", "param")}
    message = {"type": "error", **top, "status": status, "error": error}
    return msgspec.json.encode(message).decode()


def _invalid(message: str, code: str = "invalid_request") -> str:
    error: dict[str, object] = {"type": "invalid_request_error", "code": code}
    return _error(400, {**error, "message": message, "param": None})


class ResponsesConnection:
    """One WebSocket connection: its inbox, its own store, the response in flight."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        settings = app_state(websocket.app).settings.responses
        self.store = ResponseStore(
            max_responses=CONNECTION_RESPONSES, max_bytes=settings.max_stored_bytes, ttl_s=None
        )
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.closed = asyncio.Event()
        self.headers = [(k, v) for k, v in websocket.scope["headers"] if k in _CARRIED]

    async def serve(self) -> None:
        reader = asyncio.create_task(self._read(), name="responses-ws-reader")
        try:
            while (text := await self.inbox.get()) is not None:
                if not await self._while_open(self._one(text)):
                    return
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self) -> None:
        """Queue the client's messages; None once it is gone."""
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if self.inbox.qsize() >= MAX_QUEUED:
                    reason = f"more than {MAX_QUEUED} messages queued behind a response"
                    await self.websocket.close(1008, reason)
                    break
                text = message.get("text")
                # a binary frame is queued as "" and answered with an error
                self.inbox.put_nowait(text if isinstance(text, str) else "")
        finally:
            self.closed.set()
            self.inbox.put_nowait(None)

    async def _while_open(self, work: Coroutine[object, object, None]) -> bool:
        """Run `work` (a coroutine) until it ends or the client goes away (then cancel
        it, which disconnects its in-process request). False when the client is gone."""
        task = asyncio.create_task(work)
        closed = asyncio.create_task(self.closed.wait())
        try:
            await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, _Closed):
                await task
            return False
        try:
            task.result()
        except _Closed:
            return False
        return True

    async def _send(self, text: str) -> None:
        try:
            await self.websocket.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise _Closed from exc

    async def _one(self, text: str) -> None:
        body = self._create_body(text)
        if isinstance(body, str):
            await self._send(body)
            return
        request = InProcessRequest(
            method="POST",
            path="/v1/responses",
            headers=[*self.headers, (b"content-type", b"application/json")],
            body=body,
            client=self.websocket.scope.get("client"),
            extensions={CONNECTION_STORE: self.store},
        )
        async with dispatch(self.websocket.app, request) as exchange:
            if exchange.status != 200:
                await self._send(_failure(exchange.status, await exchange.read()))
                return
            buffer = b""
            async for chunk in exchange.chunks():
                buffer += chunk
                *frames, buffer = buffer.split(b"\n\n")
                for frame in frames:
                    data = frame.partition(b"data: ")[2]
                    if data:
                        await self._send(data.decode())

    def _create_body(self, text: str) -> bytes | str:
        """The POST body of a `response.create` message, or the error message to send."""
        if len(text) > MAX_MESSAGE_BYTES:
            return _invalid("message too large", "request_too_large")
        try:
            message = _decoder.decode(text)
        except msgspec.DecodeError:
            return _invalid("each message must be a JSON object (text frame)")
        if not isinstance(message, dict) or message.get("type") != "response.create":
            return _invalid('send {"type": "response.create", ...} messages', "unknown_type")
        body = {k: v for k, v in message.items() if k not in ("type", "background")}
        body["stream"] = True
        return msgspec.json.encode(body)


def _failure(status: int, body: bytes) -> str:
    try:
        decoded = _decoder.decode(body)
        error = decoded.get("error") if isinstance(decoded, dict) else None
    except msgspec.DecodeError:
        error = None
    if not isinstance(error, dict):
        error = {"type": "server_error", "code": None, "message": f"HTTP {status}", "param": None}
    return _error(status, {str(k): v for k, v in error.items()})


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    """WebSocket mode of the Responses API (see the module docstring)."""
    await websocket.accept()
    connection = ResponsesConnection(websocket)
    await connection.serve()
    with contextlib.suppress(RuntimeError):
        await websocket.close()
