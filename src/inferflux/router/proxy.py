"""Forwarding one HTTP request to a replica and relaying its answer.

Owns: `Forwarder.forward`: read the body once (413 above `max_request_bytes`), key the
prompt for prefix affinity, pick a replica, send, and relay the response chunk by chunk.
A replica that refuses before answering (connection refused or reset, 503) costs a try:
the request is replayed on another one, at most `max_attempts` replicas in all; once the
response head went to the client there is no retry. A stream its replica cuts ends with
an error event in the client's dialect (`wire.stream_cut_tail`). A client that goes away
closes the replica's response, so the replica aborts the generation.
Does not own: health polling (`health.py`), the choice itself (`replicas.py`).
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import httpx
import msgspec
from starlette.types import Receive, Scope, Send

from inferflux.config.router_settings import RouterSettings
from inferflux.errors import RequestTooLarge, ServiceUnavailable
from inferflux.observability.router_metrics import RouterMetrics
from inferflux.router.directory import SharedDirectory
from inferflux.router.prefix_index import (
    PrefixMatch,
    affinity_text,
    last_full_block,
    namespace,
    prompt_blocks,
)
from inferflux.router.replicas import PromptKey, Replica, ReplicaPicker
from inferflux.router.wire import (
    EventCutter,
    error_response,
    is_stream,
    request_headers,
    response_headers,
    stream_cut_tail,
)

logger = logging.getLogger(__name__)

_decoder = msgspec.json.Decoder()
# before any response byte: the replica is down or went down under this request
_REFUSED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)
_CREDENTIAL_HEADERS = (b"authorization", b"x-api-key", b"api-key")
_GONE = b"\x00client gone"  # a sentinel compared by identity, never sent


class ReplicaTimeout(ServiceUnavailable):
    """The replica took the request but sent no response head within
    router.read_timeout_s (the request is not replayed: it may have run)."""

    http_status = 504
    code = "replica_timeout"


class _Outcome(enum.Enum):
    DONE = "done"
    RETRY = "retry"


@dataclass(slots=True)
class _Call:
    """One client request as the router holds it while it tries replicas."""

    scope: Scope
    receive: Receive
    send: Send
    body: bytes
    target: str
    headers: list[tuple[bytes, bytes]]
    arrived_at: float
    routed_s: float = 0.0  # time spent before the first replica was asked


class Forwarder:
    """Sends requests to replicas. One per router; the state it reads and updates lives
    in the replicas, the picker and the metrics it is given (event loop only)."""

    def __init__(
        self,
        settings: RouterSettings,
        replicas: list[Replica],
        clients: list[httpx.AsyncClient],
        picker: ReplicaPicker,
        metrics: RouterMetrics,
        on_eject: Callable[[Replica], None],
        directory: SharedDirectory | None = None,
    ) -> None:
        self._settings = settings
        self._replicas = replicas
        self._clients = clients
        self._picker = picker
        self._metrics = metrics
        self._on_eject = on_eject
        self._directory = directory
        self._open_streams: defaultdict[int, set[anyio.CancelScope]] = defaultdict(set)

    async def forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request through a replica (see the module docstring)."""
        arrived_at = time.monotonic()
        body = await _read_body(receive, self._settings.max_request_bytes)
        if body is _GONE:
            return  # the client left before it finished sending
        if body is None:
            limit = self._settings.max_request_bytes
            error = RequestTooLarge(
                f"request body larger than {limit} bytes (router.max_request_bytes)"
            )
            await error_response(send, error, scope["path"])
            return
        call = _Call(
            scope,
            receive,
            send,
            body,
            _target(scope),
            request_headers(scope["headers"]),
            arrived_at,
        )
        prompt = self._prompt_key(call)
        shared = await self._shared_matches(prompt)
        tried: set[int] = set()
        for attempt in range(self._settings.max_attempts):
            candidates = [r for r in self._replicas if r.healthy and r.index not in tried]
            if not candidates:
                break
            pick = self._picker.pick(candidates, prompt, shared)
            self._metrics.decisions.labels(pick.decision).inc()
            if self._directory is not None:
                self._directory.record(pick.replica.index, prompt.hashes, prompt.end)
            tried.add(pick.replica.index)
            last = attempt + 1 == self._settings.max_attempts or len(candidates) == 1
            if await self._attempt(call, pick.replica, last) is _Outcome.DONE:
                return
        self._metrics.unavailable.inc()
        unavailable = ServiceUnavailable(
            "no replica is available to serve this request; retry later"
        )
        await error_response(send, unavailable, scope["path"])

    async def _shared_matches(self, prompt: PromptKey) -> list[PrefixMatch] | None:
        if self._directory is None or self._settings.routing != "prefix_affinity":
            return None
        return await self._directory.match(prompt.hashes)

    def _prompt_key(self, call: _Call) -> PromptKey:
        """Block hashes of the body's prompt, namespaced by model and credential. A body
        that is not a JSON object (a GET, malformed JSON) has none."""
        if not call.body or call.body[:1] != b"{":
            return PromptKey([], -1)
        try:
            parsed = _decoder.decode(call.body)
        except msgspec.DecodeError:
            return PromptKey([], -1)
        if not isinstance(parsed, dict):
            return PromptKey([], -1)
        text = affinity_text(parsed)
        model = parsed.get("model")
        seed = namespace(model if isinstance(model, str) else None, _credential(call.headers))
        block_chars = self._settings.affinity_block_chars
        hashes = prompt_blocks(seed, text, block_chars)
        return PromptKey(hashes, last_full_block(len(text), block_chars))

    async def _attempt(self, call: _Call, replica: Replica, last: bool) -> _Outcome:
        """One try on `replica`. RETRY: it refused before answering and another may. A
        client that goes away cancels the try, waiting for the head or relaying the body
        alike, which closes the replica's connection, so the replica aborts the work."""
        client = self._clients[replica.index]
        request = client.build_request(
            call.scope["method"], call.target, headers=call.headers, content=call.body
        )
        replica.num_in_flight += 1
        replica.num_requests += 1
        gauge = self._metrics.in_flight.labels(str(replica.index))
        gauge.inc()
        asked_at = time.monotonic()
        if not call.routed_s:
            call.routed_s = asked_at - call.arrived_at
        outcome = _Outcome.DONE  # also when the client went away (nothing left to do)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_cancel_on_disconnect, call.receive, group.cancel_scope)
                outcome = await self._exchange(call, replica, client, request, last)
                group.cancel_scope.cancel()
        finally:
            replica.num_in_flight -= 1
            gauge.dec()
        return outcome

    async def _exchange(
        self,
        call: _Call,
        replica: Replica,
        client: httpx.AsyncClient,
        request: httpx.Request,
        last: bool,
    ) -> _Outcome:
        try:
            response = await client.send(request, stream=True)
        except _REFUSED as exc:
            self._eject(replica, f"{type(exc).__name__} on a request")
            self._metrics.retries.labels("connect_error").inc()
            return _Outcome.RETRY
        except httpx.HTTPError as exc:  # a timeout with the request sent: never replayed
            await _timed_out(call, replica, exc)
            return _Outcome.DONE
        try:
            if response.status_code == 503 and not last:
                self._metrics.retries.labels("unavailable").inc()
                return _Outcome.RETRY
            await self._relay(call, replica, response)
            return _Outcome.DONE
        finally:
            await response.aclose()

    async def _relay(self, call: _Call, replica: Replica, response: httpx.Response) -> None:
        """Send the response head, then its body as it comes."""
        headed_at = time.monotonic()
        status = response.status_code
        self._metrics.requests.labels(str(replica.index), str(status)).inc()
        await call.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": response_headers(response.headers.raw, replica.index),
            }
        )
        self._metrics.added_latency.observe(call.routed_s + time.monotonic() - headed_at)
        await self._relay_body(call, replica, response)

    async def _relay_body(self, call: _Call, replica: Replica, response: httpx.Response) -> None:
        """Copy the body; a relay that `cut_streams` cancelled (its replica stopped
        answering) or whose replica failed mid-way ends with the dialect's error tail."""
        content_type = response.headers.get("content-type", "")
        tail: bytes | None = None
        with anyio.CancelScope() as cut:
            open_streams = self._open_streams[replica.index]
            open_streams.add(cut)
            try:
                tail = await self._copy_body(call, replica, response, content_type)
            except OSError:
                return  # the client went away (ASGI 2.4 servers raise from send)
            finally:
                open_streams.discard(cut)
        if tail is None:
            tail = self._cut(call, replica, content_type, "replica stopped answering")
        await call.send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _copy_body(
        self, call: _Call, replica: Replica, response: httpx.Response, content_type: str
    ) -> bytes:
        """Relay the body as it comes, complete events only; the bytes left to send last."""
        cutter = EventCutter(content_type) if is_stream(content_type) else None
        send = call.send
        try:
            async for chunk in response.aiter_raw():
                out = cutter.feed(chunk) if cutter is not None else chunk
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except httpx.HTTPError as exc:
            if isinstance(exc, _REFUSED):
                self._eject(replica, f"{type(exc).__name__} mid-response")
            return self._cut(call, replica, content_type, type(exc).__name__)
        return cutter.rest() if cutter is not None else b""

    def _cut(self, call: _Call, replica: Replica, content_type: str, why: str) -> bytes:
        self._metrics.stream_errors.labels(str(replica.index)).inc()
        logger.warning("replica %d cut a response: %s", replica.index, why)
        return stream_cut_tail(call.scope["path"], content_type)

    def cut_streams(self, replica: Replica) -> int:
        """End every response being relayed from `replica` with its error tail (the
        replica stopped answering health checks: a hang). Returns how many."""
        open_streams = list(self._open_streams[replica.index])
        for scope in open_streams:
            scope.cancel()
        return len(open_streams)

    def _eject(self, replica: Replica, reason: str) -> None:
        if replica.eject(reason):
            self._on_eject(replica)


async def _timed_out(call: _Call, replica: Replica, exc: httpx.HTTPError) -> None:
    """The replica took the request but did not answer in time: 504."""
    logger.warning("replica %d did not answer: %s", replica.index, type(exc).__name__)
    error = ReplicaTimeout(f"the replica did not answer in time ({type(exc).__name__})")
    await error_response(call.send, error, call.scope["path"])


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, None once it passes `limit` bytes, `_GONE` when the
    client disconnected first."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _GONE
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _target(scope: Scope) -> str:
    """Path and query of the client's request, as the client sent them."""
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    query: bytes = scope.get("query_string", b"")
    return (raw + b"?" + query if query else raw).decode("latin-1")


def _credential(headers: list[tuple[bytes, bytes]]) -> str | None:
    """A digest of the client's credential (the replicas' caches are per tenant)."""
    for key, value in headers:
        if key.lower() in _CREDENTIAL_HEADERS:
            return hashlib.sha256(value).hexdigest()
    return None


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
