"""`RateLimitMiddleware`: pure ASGI, innermost of the security stack (after authn, so the
principal is known). Counts each request against requests per minute and holds its
concurrency slots until the response's last byte; refuses with 429 (or 503 when the
shared store is down in `closed` mode) before the route runs. Every response that some
limit applies to carries OpenAI's `x-ratelimit-*` headers.

Token limits are charged deeper, where tokens are known: the engine wrapper
(`api/guarded_engine.py`) calls `RateLimitService.charge_prompt` / `charge_completion`
with the `RateLimitStatus` this middleware put in `rate_limit_status_var`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferflux.errors import InferfluxError
from inferflux.security.principal import get_principal
from inferflux.security.rate_limit.service import (
    RateLimitService,
    RateLimitStatus,
    rate_limit_status_var,
)
from inferflux.security.request_record import get_request_record, request_scope_var

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
        principal = get_principal(scope)
        status = RateLimitStatus()
        member = f"{scope.get('state', {}).get('request_id', '')}:{uuid.uuid4().hex}"
        record = get_request_record(scope)
        try:
            admission = await self.service.admit(principal, member, status)
        except InferfluxError as exc:
            if record is not None:
                record.policy_decisions.append(f"rate_limit:{exc.code}")
            await self.render_error(exc, path)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in status.headers().items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        token = rate_limit_status_var.set(status)
        scope_token = request_scope_var.set(scope)
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            request_scope_var.reset(scope_token)
            rate_limit_status_var.reset(token)
            with anyio.CancelScope(shield=True):
                await self.service.release(admission)
