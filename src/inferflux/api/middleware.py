"""Pure-ASGI middleware of the HTTP edge: request ids and the request-body size limit.

Owns: `RequestIdMiddleware` (outermost: creates the request's `RequestContext`, sets
`x-request-id` and the logging contextvar), `TrailingSlashMiddleware` (innermost: serves
`/v1/models/` as `/v1/models`, so no route ever answers with a redirect)
and `BodySizeLimitMiddleware` (413 for bodies over `server.max_request_bytes`). Never
`BaseHTTPMiddleware` (it breaks contextvars and streaming). Security middleware (authn,
rate limits, audit) live in `security/`.
"""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferflux.api.errors import error_response
from inferflux.asgi import drain_body
from inferflux.errors import RequestTooLarge
from inferflux.observability.logging import request_id_var
from inferflux.security.context import open_context

REQUEST_ID_HEADER = "x-request-id"
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# A rejected body is read and discarded (up to these bounds) before the 413 goes out:
# clients such as httpx send the whole body before reading, and a connection closed under
# them loses the response.
_DRAIN_MAX_BYTES = 64 * 1024 * 1024
_DRAIN_MAX_S = 5.0


class RequestIdMiddleware:
    """Gives every HTTP request its `RequestContext` and an id: the client's
    `x-request-id` if well-formed, else a fresh uuid4 hex. Sets `request_id_var` for the
    request's logs, `scope["state"]["request_id"]`, and the `x-request-id` response
    header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        open_context(scope, request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        token = request_id_var.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _VALID_REQUEST_ID.fullmatch(text) else None
    return None


class TrailingSlashMiddleware:
    """Strips trailing slashes from the path before routing (`/v1/admin/api_keys/` is
    `/v1/admin/api_keys`), in place on the scope. Starlette's own slash handling is off
    (`create_app`): it answered a 307 before the route's scope check, with a `Location`
    built from the client's `Host` header, which told any caller which admin routes exist
    and made an open redirect. Now the route runs, scope check first, like any other."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if len(path) > 1 and path.endswith("/"):
                scope["path"] = path.rstrip("/") or "/"
                raw = scope.get("raw_path")
                if isinstance(raw, bytes):
                    scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """413 (the OpenAI envelope, code `request_too_large`) for bodies over `max_bytes`,
    except POSTs under `uploads_prefix` (Ollama's blob uploads), which bound their own.

    A declared Content-Length over the limit is refused before the app runs. Bodies without
    one (chunked) are counted as they stream: the app's `receive` raises RequestTooLarge
    once the count passes the limit, which the error handlers render as the same 413.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, uploads_prefix: str | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.uploads_prefix = uploads_prefix  # POSTs here bound their own bodies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._is_upload(scope):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await drain_body(receive, max_bytes=_DRAIN_MAX_BYTES, max_s=_DRAIN_MAX_S)
            error = self._too_large(str(declared))
            await error_response(error, scope.get("path", ""))(scope, receive, send)
            return
        num_received = 0

        async def counting_receive() -> Message:
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > self.max_bytes:
                    if message.get("more_body", False):
                        await drain_body(receive, max_bytes=_DRAIN_MAX_BYTES, max_s=_DRAIN_MAX_S)
                    raise self._too_large(f"at least {num_received}")
            return message

        await self.app(scope, counting_receive, send)

    def _is_upload(self, scope: Scope) -> bool:
        prefix = self.uploads_prefix
        path: str = scope.get("path", "")
        return prefix is not None and scope.get("method") == "POST" and path.startswith(prefix)

    def _too_large(self, size: str) -> RequestTooLarge:
        return RequestTooLarge(
            f"the request body ({size} bytes) is larger than the server's limit of "
            f"{self.max_bytes} bytes (server.max_request_bytes)"
        )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
