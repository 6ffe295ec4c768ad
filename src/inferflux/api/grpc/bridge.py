"""The gRPC bridge: every inferflux.v1 call is one in-process ASGI request to the app.

Owns `AsgiBridge`, the service's method handlers. A call becomes an ASGI `http` scope
(`POST /grpc/inferflux.v1.Inference/<Method>`, the credentials, request id and trace
context from the call's metadata, the peer as the client, `GRPC_SCOPE_KEY` in its
extensions) whose body is the serialized request; the app runs it through its whole
middleware stack (authentication, scopes, rate limits, audit, request id, telemetry,
the body-size limit) to the internal routes (`routes.py`). The app's `receive` gives the
body once, then `http.disconnect` when the call ends or is cancelled (the client went
away, or its deadline passed), which aborts the generation as a closed SSE connection
does. The answer's frames (`render.py`) become the response messages; an HTTP error, or
an error frame mid-stream, ends the call with its gRPC status (`grpc_code`), the message
as details and `inferflux-error-code` (and `retry-after`) in the trailing metadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import msgspec
from starlette.types import ASGIApp, Message, Scope

from inferflux.api.grpc.render import ERROR_FLAG, GRPC_MEDIA_TYPE, FrameReader
from inferflux.api.grpc.routes import GRPC_SCOPE_KEY, PATH_PREFIX, SERVICE

logger = logging.getLogger(__name__)

__all__ = ["AsgiBridge", "grpc_code"]

CANCEL_GRACE_S = 5.0  # how long a cancelled call's request may take to unwind
_FORWARDED = frozenset(
    {"authorization", "x-api-key", "x-request-id", "traceparent", "tracestate", "user-agent"}
)
_REPLY_HEADERS = (b"x-request-id", b"retry-after", b"x-ratelimit-")
_STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.UNAVAILABLE,  # waited in the queue and never ran: retry
    409: grpc.StatusCode.FAILED_PRECONDITION,  # clashes with the server's state
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(http_status: int) -> grpc.StatusCode:
    """The gRPC status for an HTTP status of the app."""
    code = _STATUS_CODES.get(http_status)
    if code is not None:
        return code
    return grpc.StatusCode.INVALID_ARGUMENT if http_status < 500 else grpc.StatusCode.INTERNAL


class CallFailed(Exception):
    """The app answered an error: the call ends with this status."""

    def __init__(self, http_status: int, body: bytes, headers: list[tuple[str, str]]) -> None:
        super().__init__(http_status)
        self.code = grpc_code(http_status)
        self.details, error_code = _error_details(body)
        self.trailers = [("inferflux-error-code", error_code), *headers]


def _error_details(body: bytes) -> tuple[str, str]:
    """(message, code) of an OpenAI-shaped error body; the field at fault first."""
    try:
        error = msgspec.json.decode(body)["error"]
        message, param = str(error["message"]), error.get("param")
        code = str(error.get("code") or error.get("type") or "error")
    except (msgspec.DecodeError, KeyError, TypeError):
        return "the server failed to answer; the failure was logged", "internal_error"
    if param and str(param) not in message:
        message = f"{param}: {message}"
    return message, code


class AsgiCall:
    """One call as an ASGI request: the app runs as a task; its body comes back in chunks."""

    def __init__(self, app: ASGIApp, scope: Scope, body: bytes) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.failed = False
        self._app = app
        self._scope = scope
        self._body: bytes | None = body
        self._gone = asyncio.Event()
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(), name=f"grpc {scope['path']}")

    async def _run(self) -> None:
        try:
            await self._app(self._scope, self._receive, self._send)
        except Exception:
            self.failed = True
            logger.exception("the app failed a gRPC call to %s", self._scope["path"])
        finally:
            self._chunks.put_nowait(None)

    async def _receive(self) -> Message:
        body, self._body = self._body, None
        if body is not None:
            return {"type": "http.request", "body": body, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body" and message.get("body"):
            self._chunks.put_nowait(bytes(message["body"]))

    async def chunks(self) -> AsyncIterator[bytes]:
        """The response body as the app sends it, until it is complete."""
        while (chunk := await self._chunks.get()) is not None:
            yield chunk

    def reply_headers(self) -> list[tuple[str, str]]:
        """The response headers a gRPC client gets as metadata (request id, limits)."""
        return [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in self.headers
            if name.startswith(_REPLY_HEADERS)
        ]

    async def close(self) -> None:
        """Tell the app the client is gone (a no-op for a finished request), and wait for
        it to unwind; cancelled after `CANCEL_GRACE_S`."""
        self._gone.set()
        done, _ = await asyncio.wait({self._task}, timeout=CANCEL_GRACE_S)
        if not done:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class AsgiBridge:
    """The inferflux.v1.Inference service, answered by `app` in this process."""

    def __init__(self, app: ASGIApp, *, tls: bool) -> None:
        self.app = app
        self.scheme = "https" if tls else "http"

    def handler(self) -> grpc.GenericRpcHandler:
        stream, unary = grpc.unary_stream_rpc_method_handler, grpc.unary_unary_rpc_method_handler
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Generate": stream(self._streaming("Generate")),
                "Chat": stream(self._streaming("Chat")),
                "Embed": unary(self._unary("Embed")),
                "ListModels": unary(self._unary("ListModels")),
            },
        )

    def _streaming(
        self, method: str
    ) -> Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], AsyncIterator[bytes]]:
        async def serve(
            request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
        ) -> AsyncIterator[bytes]:
            call = AsgiCall(self.app, self.scope(method, request, context), request)
            try:
                async for message in _messages(call, context):
                    yield message
            except CallFailed as failure:
                await context.abort(failure.code, failure.details, tuple(failure.trailers))
            finally:
                await call.close()

        return serve

    def _unary(
        self, method: str
    ) -> Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]:
        async def serve(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            call = AsgiCall(self.app, self.scope(method, request, context), request)
            try:
                messages = [message async for message in _messages(call, context)]
            except CallFailed as failure:
                await context.abort(failure.code, failure.details, tuple(failure.trailers))
            finally:
                await call.close()
            if len(messages) != 1:
                await context.abort(grpc.StatusCode.INTERNAL, "the server sent no answer")
            return messages[0]

        return serve

    def scope(
        self, method: str, body: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> Scope:
        """The ASGI scope of one call."""
        path = f"{PATH_PREFIX}/{method}"
        headers = [
            (key.encode("latin-1"), value.encode("latin-1"))
            for key, value in context.invocation_metadata() or ()
            if key in _FORWARDED and isinstance(value, str)
        ]
        headers += [
            (b"content-type", GRPC_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "method": "POST",
            "scheme": self.scheme,
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": peer_address(context.peer()),
            "server": None,
            "state": {},
            "extensions": {GRPC_SCOPE_KEY: {}},
        }


async def _messages(
    call: AsgiCall, context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    """The call's response messages; raises CallFailed for an error answer or frame."""
    reader = FrameReader()
    error_body = b""
    started = False
    async for chunk in call.chunks():
        if call.status != 200:
            error_body += chunk
            continue
        if not started:
            started = True
            await context.send_initial_metadata(tuple(call.reply_headers()))
        for flag, payload in reader.feed(chunk):
            if flag == ERROR_FLAG:
                raise _frame_failure(payload)
            yield payload
    if call.failed or call.status != 200:
        status = 500 if call.failed else call.status
        raise CallFailed(status, error_body, call.reply_headers())


def _frame_failure(payload: bytes) -> CallFailed:
    try:
        status = int(msgspec.json.decode(payload)["status"])
    except (msgspec.DecodeError, KeyError, TypeError, ValueError):
        status = 500
    return CallFailed(status, payload, [])


def peer_address(peer: str) -> tuple[str, int] | None:
    """`ipv4:127.0.0.1:5000` or `ipv6:[::1]:5000` → (host, port); None for others."""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = address.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None
