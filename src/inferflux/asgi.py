"""ASGI helpers shared by the API's and the security layer's middleware (a foundation:
it imports no layer)."""

from __future__ import annotations

import anyio
from starlette.types import Receive


async def drain_body(receive: Receive, *, max_bytes: int, max_s: float) -> None:
    """Read and drop the rest of a request body, at most `max_bytes` and `max_s`, before
    answering early: a client still sending gets the answer instead of a reset connection."""
    num_drained = 0
    with anyio.move_on_after(max_s):
        while num_drained < max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return
            num_drained += len(message.get("body", b""))
            if not message.get("more_body", False):
                return
