"""What the router writes itself: headers it forwards, its own error bodies, and the
last event of a stream its replica cut, in the client's dialect.

Owns: the hop-by-hop header filter (RFC 9110 §7.6.1), `error_response` (an OpenAI-shaped
error the router answers on its own: 413, 503), `stream_cut_tail` (mirrors how a replica
ends a stream whose worker died: `api/sse.py`, `api/ollama/render.py`,
`api/anthropic/render.py`) and `EventCutter` (relays complete events only, so the error
event never lands inside a half-sent one). Does not own: routing or the connections.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from starlette.types import Send

from inferflux.errors import EngineDeadError, InferfluxError, ServiceUnavailable

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# the router sets these itself (host: the replica's; content-length: of the replayed body)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}
REPLICA_HEADER = b"x-inferflux-replica"
STREAM_CUT_MESSAGE = "the replica serving this stream went away mid-stream; retry the request"
NATIVE_STREAM_PATHS = frozenset({"/generate", "/chat"})  # native SSE: no [DONE] at the end

_ANTHROPIC_TYPES = {413: "request_too_large", 503: "overloaded_error", 504: "timeout_error"}

_encoder = msgspec.json.Encoder()


def request_headers(raw: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers to send on: all but hop-by-hop ones (and those that
    `Connection` names), host and content-length. Credentials pass unchanged."""
    headers = list(raw)
    named = {
        token.strip().lower()
        for key, value in headers
        if key.lower() == b"connection"
        for token in value.split(b",")
    }
    return [(k, v) for k, v in headers if k.lower() not in _NOT_FORWARDED | named]


def response_headers(
    raw: Iterable[tuple[bytes, bytes]], replica_index: int
) -> list[tuple[bytes, bytes]]:
    """The replica's headers to send back (hop-by-hop ones dropped), plus which replica
    answered (its index in router.replicas, never its address)."""
    kept = [(k, v) for k, v in raw if k.lower() not in HOP_BY_HOP]
    return [*kept, (REPLICA_HEADER, str(replica_index).encode())]


def error_body(error: InferfluxError, path: str) -> object:
    """The body a replica would give `error` on `path` (`api/errors.error_body`):
    Ollama's `{"error": message}` under /api/ (not LM Studio's /api/v0/), Anthropic's
    shape under /v1/messages, else the OpenAI envelope."""
    if path.startswith("/api/") and not path.startswith("/api/v0/"):
        return {"error": error.message}
    if path.startswith("/v1/messages"):
        kind = _ANTHROPIC_TYPES.get(error.http_status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": error.message}}
    return error.to_body()


async def error_response(send: Send, error: InferfluxError, path: str) -> None:
    """Answer `error` as a replica would on `path`, with its headers and, for a 503 or a
    504, Retry-After."""
    body = _encoder.encode(error_body(error, path))
    extra = dict(error.headers())
    if isinstance(error, ServiceUnavailable):
        extra.setdefault("retry-after", str(error.retry_after_s))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in extra.items()),
    ]
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def is_stream(content_type: str) -> bool:
    return "text/event-stream" in content_type or "ndjson" in content_type


def stream_cut_tail(path: str, content_type: str) -> bytes:
    """The closing event(s) of a stream cut by its replica, as the client's dialect ends
    a stream whose worker died: OpenAI (and LM Studio) `data: {"error": ...}` then
    `data: [DONE]`; native SSE the error event alone; Anthropic `event: error`; the
    Responses API an `error` event; Ollama NDJSON an `{"error": "..."}` line."""
    error = EngineDeadError(STREAM_CUT_MESSAGE)
    if "ndjson" in content_type:
        return _encoder.encode({"error": error.message}) + b"\n"
    if "text/event-stream" not in content_type:
        return b""
    if path.startswith("/v1/messages"):
        anthropic = {"type": "error", "error": {"type": "api_error", "message": error.message}}
        return b"event: error\ndata: " + _encoder.encode(anthropic) + b"\n\n"
    if path.startswith("/v1/responses"):
        payload: dict[str, str | None] = {
            "type": "error",
            "code": error.code,
            "message": error.message,
            "param": None,
        }
        return b"event: error\ndata: " + _encoder.encode(payload) + b"\n\n"
    event = b"data: " + _encoder.encode(error.to_body()) + b"\n\n"
    return event if path in NATIVE_STREAM_PATHS else event + b"data: [DONE]\n\n"


class EventCutter:
    """Splits a relayed stream at event boundaries (a blank line for SSE, a newline for
    NDJSON): `feed` returns what may be sent now and keeps an unfinished event back;
    `rest` is what is left at the end. Bytes pass through otherwise unchanged."""

    __slots__ = ("_pending", "_separator")

    def __init__(self, content_type: str) -> None:
        self._separator = b"\n\n" if "text/event-stream" in content_type else b"\n"
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(self._separator)
        if cut < 0:
            self._pending = data
            return b""
        cut += len(self._separator)
        self._pending = data[cut:]
        return data[:cut]

    def rest(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest
