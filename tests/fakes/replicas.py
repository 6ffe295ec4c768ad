"""`FakeReplicas`: an httpx transport that answers as several replicas would, for unit
tests of the router's retry, ejection and stream-cut logic (no model, no sockets).

Each replica (by host, `replica0` ...) has a mode: `ok` (JSON answers, SSE / NDJSON
streams), `refuse` (connection refused), `busy` (503), `cut` (a stream that dies after
its first event), `hang` (a stream that stops after its first event, the connection open),
`down` (refuses everything, /readyz included), `draining` (/readyz 503). Every request is logged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx


def replica_urls(n: int) -> list[str]:
    return [f"http://replica{i}:8080" for i in range(n)]


class _Body(httpx.AsyncByteStream):
    """A body read as a stream (httpx reads a plain `content=` body at once, as a real
    connection never does)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


def _response(status: int, data: bytes, content_type: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, headers={"content-type": content_type, **headers}, stream=_Body(data)
    )


def _json(status: int, payload: object, **headers: str) -> httpx.Response:
    return _response(status, json.dumps(payload).encode(), "application/json", **headers)


class _CutStream(httpx.AsyncByteStream):
    def __init__(self, first: bytes) -> None:
        self._first = first

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._first
        yield self._first[: len(self._first) // 2]  # half an event, then the replica dies
        raise httpx.ReadError("connection reset by peer")


class _HangingStream(httpx.AsyncByteStream):
    def __init__(self, first: bytes, started: asyncio.Event) -> None:
        self._first = first
        self._started = started

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._first
        self._started.set()
        await asyncio.Event().wait()  # a hung replica: never another byte
        yield b""


class FakeReplicas(httpx.AsyncBaseTransport):
    def __init__(self, n: int) -> None:
        self.modes = {f"replica{i}": "ok" for i in range(n)}
        self.log: list[tuple[str, str, bytes]] = []  # (host, path, body)
        self.hanging = asyncio.Event()  # set once a `hang` stream sent its first event

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        mode = self.modes[host]
        path = request.url.path
        body = await request.aread()
        if path in ("/readyz", "/metrics"):
            if mode == "down":
                raise httpx.ConnectError("connection refused", request=request)
            if mode == "draining" and path == "/readyz":
                return _json(503, {"status": "draining"})
            text = "inferflux_scheduler_queue_depth 0.0\n" if path == "/metrics" else "{}"
            return httpx.Response(200, text=text)
        self.log.append((host, path, body))
        if mode in ("refuse", "down"):
            raise httpx.ConnectError("connection refused", request=request)
        if mode == "busy":
            error = {"message": "queue full", "type": "service_unavailable", "param": None,
                     "code": "queue_full"}  # fmt: skip
            return _json(503, {"error": error}, **{"retry-after": "1"})
        wants_stream = json.loads(body or b"{}").get("stream", False)
        if not wants_stream:
            return _json(200, {"served_by": host, "auth": _auth(request)})
        ndjson = path.startswith("/api/")
        event = b'{"message": "tok"}\n' if ndjson else b'data: {"choices": []}\n\n'
        content_type = "application/x-ndjson" if ndjson else "text/event-stream"
        if mode == "hang":
            stream = _HangingStream(event, self.hanging)
            return httpx.Response(200, headers={"content-type": content_type}, stream=stream)
        if mode == "cut":
            return httpx.Response(
                200, headers={"content-type": content_type}, stream=_CutStream(event)
            )
        end = b'{"done": true}\n' if ndjson else b"data: [DONE]\n\n"
        return _response(200, event + end, content_type)


def _auth(request: httpx.Request) -> str | None:
    return request.headers.get("authorization")
