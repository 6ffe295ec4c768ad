"""The gRPC bridge: every inferflux.v1 call is one in-process request to the app.

Owns `AsgiBridge`, the service's method handlers. A call becomes one request through the
app's whole middleware stack (`api/inprocess.dispatch`: authentication, scopes, rate
limits, audit, request id, telemetry, the body-size limit) to the internal routes
(`routes.py`): `POST /grpc/inferflux.v1.Inference/<Method>`, the serialized request as
its body, the credentials, request id and trace context from the call's metadata, the
peer as the client, and `GRPC_SCOPE_KEY` in the scope's extensions. When the call ends
or is cancelled (the client went away, or its deadline passed) the app sees
`http.disconnect`, which aborts the generation as a closed SSE connection does. The
answer's frames (`render.py`) become the response messages; an HTTP error, or an error
frame mid-stream, ends the call with its gRPC status (`grpc_code`), the message as
details and `inferflux-error-code` (and `retry-after`) in the trailing metadata. A
stream that ends without its `finish`, or a unary answer that is not one message, is
INTERNAL: a client never takes a cut answer for a whole one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import msgspec
from starlette.types import ASGIApp

from inferflux.api.errors import log_unexpected
from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.grpc.render import ERROR_FLAG, GRPC_MEDIA_TYPE, FrameReader, StreamMessage
from inferflux.api.grpc.routes import GRPC_SCOPE_KEY, PATH_PREFIX, SERVICE
from inferflux.api.inprocess import InProcessRequest, dispatch

__all__ = ["AsgiBridge", "grpc_code"]

Context = grpc.aio.ServicerContext[bytes, bytes]
_NO_ANSWER = "the server ended the call without an answer; the failure was logged"
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

    def __init__(self, http_status: int, body: bytes, headers: tuple[tuple[str, str], ...]) -> None:
        super().__init__(http_status)
        self.code = grpc_code(http_status)
        self.details, error_code = _error_details(body)
        self.trailers = (("inferflux-error-code", error_code), *headers)


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


class AsgiBridge:
    """The inferflux.v1.Inference service, answered by `app` in this process."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def handler(self) -> grpc.GenericRpcHandler:
        stream, unary = grpc.unary_stream_rpc_method_handler, grpc.unary_unary_rpc_method_handler
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Generate": stream(self._streaming("Generate", pb.GenerateResponse)),
                "Chat": stream(self._streaming("Chat", pb.ChatResponse)),
                "Embed": unary(self._unary("Embed")),
                "ListModels": unary(self._unary("ListModels")),
            },
        )

    def _streaming(
        self, method: str, message_class: StreamMessage
    ) -> Callable[[bytes, Context], AsyncIterator[bytes]]:
        async def serve(request: bytes, context: Context) -> AsyncIterator[bytes]:
            last = b""
            try:
                async for message in self._messages(method, request, context):
                    last = message
                    yield message
            except CallFailed as failure:
                await context.abort(failure.code, failure.details, failure.trailers)
            if not message_class.FromString(last).HasField("finish"):
                await context.abort(grpc.StatusCode.INTERNAL, _NO_ANSWER)

        return serve

    def _unary(self, method: str) -> Callable[[bytes, Context], Awaitable[bytes]]:
        async def serve(request: bytes, context: Context) -> bytes:
            try:
                messages = [m async for m in self._messages(method, request, context)]
            except CallFailed as failure:
                await context.abort(failure.code, failure.details, failure.trailers)
            if len(messages) != 1:
                await context.abort(grpc.StatusCode.INTERNAL, _NO_ANSWER)
            return messages[0]

        return serve

    async def _messages(
        self, method: str, request: bytes, context: Context
    ) -> AsyncIterator[bytes]:
        """The answer's messages; raises CallFailed for an error answer or frame."""
        try:
            async with dispatch(self.app, call_request(method, request, context)) as exchange:
                headers = _reply_headers(exchange.headers)
                if exchange.status != 200:
                    raise CallFailed(exchange.status, await exchange.read(), headers)
                await context.send_initial_metadata(headers)
                reader = FrameReader()
                async for chunk in exchange.chunks():
                    for flag, payload in reader.feed(chunk):
                        if flag == ERROR_FLAG:
                            raise _frame_failure(payload)
                        yield payload
        except (CallFailed, asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # the app failed without an answer: a bug, logged
            log_unexpected(exc, f"the gRPC call {method}")
            raise CallFailed(500, b"", ()) from None


def call_request(method: str, body: bytes, context: Context) -> InProcessRequest:
    """One call as the app's request: its path, the metadata the app reads (credentials,
    request id, trace context), the peer, and the bridge's marker."""
    headers = [
        (key.encode("latin-1"), value.encode("latin-1"))
        for key, value in context.invocation_metadata() or ()
        if key in _FORWARDED and isinstance(value, str)
    ]
    headers.append((b"content-type", GRPC_MEDIA_TYPE.encode()))
    return InProcessRequest(
        "POST",
        f"{PATH_PREFIX}/{method}",
        headers,
        body,
        client=peer_address(context.peer()),
        extensions={GRPC_SCOPE_KEY: {}},
    )


def _reply_headers(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str], ...]:
    """The response headers a gRPC client gets as metadata (request id, limits)."""
    return tuple(
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in headers
        if name.startswith(_REPLY_HEADERS)
    )


def _frame_failure(payload: bytes) -> CallFailed:
    try:
        status = int(msgspec.json.decode(payload)["status"])
    except (msgspec.DecodeError, KeyError, TypeError, ValueError):
        status = 500
    return CallFailed(status, payload, ())


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
