"""`guarded_h11`: uvicorn's h11 protocol with the connection limits uvicorn lacks.

uvicorn bounds an idle keep-alive connection (`timeout_keep_alive`) and a request head's
size (16 KiB), but not the time a client may take to send a request: a connection that
never sends a byte, or sends its head or body a byte at a time (slowloris), holds a socket
and a task forever. The protocol here adds, per connection:

- `server.header_timeout_s`: the whole request head must arrive within this many seconds
  of the connection opening (or of the first byte of a next request on a kept-alive
  connection); otherwise the connection is closed.
- `server.body_timeout_s`: the whole body must arrive within this many seconds of its
  head; otherwise the client gets 408 (an OpenAI-shaped error) when no response has
  started, and the connection is closed. The app sees a disconnect.
- `server.max_connections`: connections beyond it get 503 (OpenAI-shaped, `Retry-After`)
  and are closed at once, before the app runs. It is capped below the process's open-file
  limit so accepting never fails for lack of descriptors.

Streaming responses are bounded elsewhere: a stream's deltas wait in the API process only
until the client reads them, at most `max_tokens` of them (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import resource
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_FD_RESERVE = 128  # descriptors kept for files, model mmaps, worker sockets


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


def effective_max_connections(configured: int) -> int:
    """`configured`, capped at the soft open-file limit less a reserve."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    return max(1, min(configured, int(soft) - _FD_RESERVE))


def _error_response(status: int, reason: bytes, code: str, message: str) -> bytes:
    body = json.dumps(
        {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    ).encode()
    retry = b"retry-after: 1\r\n" if status == 503 else b""
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"%sconnection: close\r\n\r\n" % (status, reason, len(body), retry)
    )
    return head + body


class _GuardedH11Protocol(H11Protocol):
    limits: ConnectionLimits  # set by `guarded_h11`

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # Any: uvicorn's signature
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            message = (
                f"too many open connections (server.max_connections "
                f"{self.limits.max_connections}); retry shortly"
            )
            transport.write(_error_response(503, b"Service Unavailable", "overloaded", message))
            transport.close()
            return
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self.conn.their_state
        super().data_received(data)
        after = self.conn.their_state
        if after is h11.IDLE:
            if self._deadline is None:  # the first byte of a next request's head
                self._arm(self.limits.header_timeout_s)
        elif after is h11.SEND_BODY:
            if before is not h11.SEND_BODY:  # the head just ended: the body's deadline
                self._arm(self.limits.body_timeout_s)
        else:
            self._disarm()

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, self._on_deadline)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _on_deadline(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and self.conn.our_state is h11.SEND_RESPONSE:
            started = self.cycle is not None and self.cycle.response_started
            if not started:
                message = (
                    f"the request body did not arrive within server.body_timeout_s "
                    f"({self.limits.body_timeout_s:g} s)"
                )
                self.transport.write(
                    _error_response(408, b"Request Timeout", "request_timeout", message)
                )
        if state in (h11.IDLE, h11.SEND_BODY):
            self.transport.close()


def guarded_h11(limits: ConnectionLimits) -> type[H11Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, enforcing `limits`."""
    capped = ConnectionLimits(
        limits.header_timeout_s,
        limits.body_timeout_s,
        effective_max_connections(limits.max_connections),
    )
    return type("GuardedH11Protocol", (_GuardedH11Protocol,), {"limits": capped})
