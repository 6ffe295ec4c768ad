"""Length-prefixed frames over a Unix stream socket: the workers' output channel.

Owns: the wire format of worker → API messages (a 4-byte little-endian length, then that
many bytes of one msgspec message), `FrameWriter` (the worker's blocking end, which never
hangs on an API process that is gone) and `FrameReader` (the API's asyncio protocol,
which hands each whole frame to a callback). Does not own: what the frames say
(messages.py) or the API → worker direction (ZeroMQ, worker_pool.py).

Why not ZeroMQ for this direction: every step of every worker sends one message, and a
ZeroMQ send goes through two background I/O threads (the worker's and the API's) before
the event loop sees it. On a machine whose cores llama.cpp's threads already fill, each
of those wake-ups preempts a decode thread; a plain stream socket wakes only the event
loop, whose transport calls `FrameReader.data_received` directly (no futures, no
`zmq.asyncio` polling). Measured in BENCHMARKS.md, "CPU (issue 10), second pass: the
worker → API output channel".
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

_HEADER = 4
MAX_FRAME_BYTES = 1 << 30  # a frame claiming more is a corrupt stream


class ChannelClosed(Exception):
    """The reader is gone (its socket closed) or stopped reading for too long."""


def frame(payload: bytes) -> bytes:
    """`payload` with its length prefix."""
    return len(payload).to_bytes(_HEADER, "little") + payload


class FrameWriter:
    """The sending end: a connected Unix stream socket, written without ever hanging.

    `send` blocks while the socket buffer is full (the API is busy: back-pressure), and
    every `poll_s` asks `gone()`; when that says the reader is gone, or nothing could be
    written for `give_up_s`, it raises ChannelClosed. A frame is always written whole or
    the channel is given up: a half-written frame never starts another.
    """

    def __init__(
        self,
        path: str,
        gone: Callable[[], bool],
        *,
        poll_s: float = 1.0,
        give_up_s: float = 30.0,
    ) -> None:
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(path)
        self._socket.setblocking(False)
        self._poller = select.poll()
        self._poller.register(self._socket, select.POLLOUT)
        self._gone = gone
        self._poll_ms = int(poll_s * 1000)
        self._give_up_s = give_up_s

    def send(self, payload: bytes) -> None:
        data = memoryview(frame(payload))
        deadline = time.monotonic() + self._give_up_s
        while data:
            try:
                data = data[self._socket.send(data) :]
                continue
            except BlockingIOError:
                pass
            except OSError as exc:  # EPIPE, ECONNRESET: the reader closed its end
                raise ChannelClosed(f"the output channel closed: {exc}") from None
            if not self._poller.poll(self._poll_ms) and (
                self._gone() or time.monotonic() > deadline
            ):
                raise ChannelClosed("the reader has not read its output for too long")

    def close(self) -> None:
        self._socket.close()


class FrameReader(asyncio.Protocol):
    """The receiving end, one per connected writer: calls `on_frame(payload)` for every
    whole frame, in order. A frame that `on_frame` fails on is logged and skipped; a
    length over MAX_FRAME_BYTES closes the connection (the writer sees ChannelClosed)."""

    def __init__(self, on_frame: Callable[[bytes], None]) -> None:
        self._on_frame = on_frame
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        if not buffer and _whole_frame(data):
            self._deliver(data[_HEADER:])  # NOTE: the usual case, one step's message
            return
        buffer += data
        while len(buffer) >= _HEADER:
            size = int.from_bytes(buffer[:_HEADER], "little")
            if size > MAX_FRAME_BYTES:
                logger.error("a worker sent a %d-byte frame; closing its channel", size)
                buffer.clear()
                if self._transport is not None:
                    self._transport.close()
                return
            end = _HEADER + size
            if len(buffer) < end:
                return
            payload = bytes(buffer[_HEADER:end])
            del buffer[:end]
            self._deliver(payload)

    def _deliver(self, payload: bytes) -> None:
        try:
            self._on_frame(payload)
        except Exception:  # NOTE: one bad message must not stop the channel
            logger.exception("a worker message could not be handled")


def _whole_frame(data: bytes) -> bool:
    return len(data) >= _HEADER and int.from_bytes(data[:_HEADER], "little") == len(data) - _HEADER
