"""WebSockets through the router (the Responses API's WebSocket mode).

Owns: `relay_websocket`: the client's upgrade becomes a WebSocket to one replica (the
least loaded healthy one: a socket has no prompt to route on when it opens), opened with
the client's credentials and subprotocols; then messages flow both ways unchanged until
either side closes, and the close code passes through. A chain of responses on one
socket stays on one replica, so `previous_response_id` works on it. A replica that
refuses the upgrade (401, 403, 404) closes the client's socket with 1008; no replica, or
one that cannot be reached, with 1013 (try again later). Does not own: picking
(`replicas.py`) or HTTP (`proxy.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import websockets
from starlette.types import Receive, Scope, Send
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from inferflux.router.replicas import Replica
from inferflux.router.wire import request_headers

logger = logging.getLogger(__name__)

POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013
# the handshake headers websockets writes itself
_OWN_HEADERS = {b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions",
                b"sec-websocket-protocol"}  # fmt: skip


async def relay_websocket(
    scope: Scope, receive: Receive, send: Send, replica: Replica | None, open_timeout_s: float
) -> None:
    """Serve one client WebSocket through `replica` (None: no replica: refused)."""
    if (await receive())["type"] != "websocket.connect":
        return
    if replica is None:
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER})
        return
    try:
        upstream = await websockets.connect(
            _ws_url(replica.url, scope),
            additional_headers=[
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in request_headers(scope["headers"])
                if k.lower() not in _OWN_HEADERS
            ],
            subprotocols=scope.get("subprotocols") or None,
            open_timeout=open_timeout_s,
            max_size=None,  # the replica enforces its own message limit
        )
    except InvalidStatus as exc:
        logger.info("replica %d refused a websocket: %d", replica.index, exc.response.status_code)
        await send({"type": "websocket.close", "code": POLICY_VIOLATION})
        return
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        logger.warning("replica %d: websocket failed: %s", replica.index, type(exc).__name__)
        await send({"type": "websocket.close", "code": TRY_AGAIN_LATER})
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
    replica.num_in_flight += 1
    try:
        await _pump(receive, send, upstream)
    finally:
        replica.num_in_flight -= 1
        await upstream.close()


async def _pump(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    """Both directions until one ends; then the other is cancelled."""
    tasks = [
        asyncio.create_task(_client_to_replica(receive, upstream)),
        asyncio.create_task(_replica_to_client(send, upstream)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, OSError):
                await task


async def _client_to_replica(receive: Receive, upstream: ClientConnection) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            await upstream.close(message.get("code", 1000))
            return
        text = message.get("text")
        await upstream.send(text if text is not None else message.get("bytes") or b"")


async def _replica_to_client(send: Send, upstream: ClientConnection) -> None:
    try:
        async for data in upstream:
            key = "text" if isinstance(data, str) else "bytes"
            await send({"type": "websocket.send", key: data})
    except ConnectionClosed:
        pass
    code = upstream.close_code or 1000
    with contextlib.suppress(OSError, RuntimeError):  # the client may be gone already
        await send({"type": "websocket.close", "code": code})


def _ws_url(base: str, scope: Scope) -> str:
    scheme = "wss" if base.startswith("https") else "ws"
    host = base.split("://", 1)[1]
    query = scope.get("query_string", b"").decode("latin-1")
    path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
    return f"{scheme}://{host}{path}" + (f"?{query}" if query else "")
