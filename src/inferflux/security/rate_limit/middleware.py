"""`RateLimitMiddleware`: pure ASGI, innermost of the security stack (after authn, so the
principal is known). Counts each request against requests per minute and holds its
concurrency slots until the response's last byte; refuses with 429 (or 503 when the
shared store is down in `closed` mode) before the route runs. Every response that some
limit applies to carries OpenAI's `x-ratelimit-*` headers.

Token limits are charged deeper, where tokens are known: the engine wrapper
(`api/guarded_engine.py`) calls `RateLimitService.charge_prompt` / `charge_completion`
with the `RateLimitStatus` this middleware put on the request's context.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferflux.errors import InferfluxError
from inferflux.security.context import context_of
from inferflux.security.rate_limit.service import RateLimitService, RateLimitStatus

# Probes and scrapes are never limited.
UNLIMITED_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})

# Renders an error as an ASGI response for a path (api/errors.error_response).
ErrorRenderer = Callable[[InferfluxError, str], ASGIApp]


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, service: RateLimitService, render_error: ErrorRenderer):
        self.app = app
        self.service = service
        self.render_error = render_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        context = context_of(scope)
        status = RateLimitStatus()
        member = f"{context.request_id}:{uuid.uuid4().hex}"
        try:
            admission = await self.service.admit(context.caller, member, status)
        except InferfluxError as exc:
            context.record.policy_decisions.append(f"rate_limit:{exc.code}")
            await self.render_error(exc, path)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in status.headers().items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        context.rate_limit = status
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            with anyio.CancelScope(shield=True):
                await self.service.release(admission)
