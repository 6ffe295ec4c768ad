"""Authentication: who is calling, decided once per request, deny by default.

Owns: `Authenticator` (credentials → `Principal` under the current policy: API keys, then
OIDC bearer JWTs) and `AuthenticationMiddleware` (pure ASGI). Does not own: scope checks
per route (`rbac.py`), key digests (`api_keys.py`), JWT verification (`oidc.py`), console
sessions (`sessions.py`).

Authentication is on when the config names a key or an OIDC issuer, or the policy holds
any key record (revoked ones included, so revoking the last key never reopens the
server). Off: every request runs as `ANONYMOUS` (every scope; `inferflux serve` warns).
On: the public paths (health probes; `/metrics` when `observability.metrics.public`) run
as `UNAUTHENTICATED`, which holds no scope; everything else, known route or not, needs
valid credentials or gets 401 before routing. Credentials in the query string are
refused (401), never read. The middleware sets the principal on the request's context
(security/context.py), and the tenant in the logging `tenant_var` for the inner app.

A web console session (the `inferflux_session` cookie, when the console is on) is a
credential equal to the key or token that signed in: same principal, re-read from the
key's record on every request (a revoked key's session gets 401). It is used only when the
request sends no Authorization or x-api-key header; a state-changing request (not GET,
HEAD, OPTIONS) with it also needs the session's `X-CSRF-Token` header (else 403
`csrf_token_invalid`), and it never opens a WebSocket.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as AsgiScope

from inferflux.asgi import drain_body
from inferflux.config.auth_settings import OidcSettings
from inferflux.config.policy_schema import NAME_PATTERN
from inferflux.errors import (
    CsrfRejected,
    InferfluxError,
    InvalidToken,
    PermissionDenied,
    Unauthorized,
)
from inferflux.observability.logging import tenant_var
from inferflux.security.api_keys import (
    CREDENTIAL_QUERY_PARAMS,
    ApiKeyIndex,
    Credentials,
    KeyDigester,
    bearer_credentials,
)
from inferflux.security.context import context_of
from inferflux.security.oidc import OidcVerifier, TokenRejected
from inferflux.security.policy import ApiKeyRecord, Policy, PolicySource
from inferflux.security.principal import ANONYMOUS, Principal, Scope
from inferflux.security.rbac import UNAUTHENTICATED
from inferflux.security.sessions import CookieSessions, Session, csrf_ok

logger = logging.getLogger(__name__)

HEALTH_PATHS = frozenset({"/healthz", "/livez", "/readyz"})
ErrorRenderer = Callable[[InferfluxError, str], ASGIApp]
_PRIORITY_RANK = {"low": 0, "normal": 1, "high": 2}
_DRAIN_MAX_BYTES = 4 * 1024 * 1024
_DRAIN_MAX_S = 2.0
_NAME = re.compile(NAME_PATTERN)
_SCOPE_NAMES = frozenset(s.value for s in Scope)


class Authenticator:
    """Turns credentials into a principal under `policy.current()`. Async-safe."""

    def __init__(
        self,
        policy: PolicySource,
        digester: KeyDigester,
        *,
        roles: Mapping[str, frozenset[Scope]],
        oidc: OidcVerifier | None = None,
        configured: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.digester = digester
        self._roles = roles
        self._oidc = oidc
        self._configured = configured or oidc is not None
        self._clock = clock
        self._index: tuple[Policy, ApiKeyIndex] | None = None
        self._by_id: tuple[Policy, dict[str, ApiKeyRecord]] | None = None

    @property
    def enabled(self) -> bool:
        """True once the config or the policy holds any key, or OIDC is configured."""
        return self._configured or bool(self.policy.current().keys)

    async def authenticate(self, credentials: Credentials) -> Principal:
        """The caller's principal. Raises Unauthorized (InvalidToken for a bad JWT); the
        message never quotes the credential."""
        if credentials.conflict:
            raise Unauthorized("send one credential: Authorization: Bearer or x-api-key")
        token = credentials.bearer if credentials.bearer is not None else credentials.api_key
        if not token:
            raise Unauthorized(
                "authentication required: send Authorization: Bearer <key> or x-api-key"
            )
        policy = self.policy.current()
        record = self._key_index(policy).lookup(token, self._clock())
        if record is not None:
            return key_principal(record, policy)
        if self._oidc is not None and credentials.bearer is not None and token.count(".") == 2:
            return await self._token_principal(token, policy)
        raise Unauthorized("invalid, expired or revoked API key")

    def refresh(self, principal: Principal) -> Principal | None:
        """A session's principal under the current policy: an API key's rebuilt from its
        record (None once the key is revoked, expired or gone); any other as it signed in."""
        if principal.kind != "api_key":
            return principal
        policy = self.policy.current()
        cached = self._by_id
        if cached is None or cached[0] is not policy:
            cached = (policy, {r.key_id: r for r in policy.keys})
            self._by_id = cached
        record = cached[1].get(principal.subject)
        if record is None or record.revoked:
            return None
        if record.expires_at is not None and record.expires_at <= self._clock():
            return None
        return key_principal(record, policy)

    def _key_index(self, policy: Policy) -> ApiKeyIndex:
        cached = self._index
        if cached is None or cached[0] is not policy:
            cached = (policy, ApiKeyIndex(policy.keys, self.digester))
            self._index = cached
        return cached[1]

    async def _token_principal(self, token: str, policy: Policy) -> Principal:
        assert self._oidc is not None
        try:
            claims = await self._oidc.verify(token)
            return claims_principal(claims, self._oidc.settings, self._roles, policy)
        except TokenRejected as exc:
            logger.info("bearer token refused: %s", exc.reason)
            raise InvalidToken(f"the bearer token is not valid ({exc.reason})") from None


def key_principal(record: ApiKeyRecord, policy: Policy) -> Principal:
    """An API key's principal: its own rights narrowed by its tenant's."""
    tenant = policy.tenant(record.tenant)
    return Principal(
        subject=record.key_id,
        kind="api_key",
        tenant=record.tenant,
        scopes=record.scopes,
        rate_limit_tier=record.rate_limit_tier,
        priority_cap=_lower_cap(record.priority_cap, tenant.priority_cap),
        allowed_models=_narrowed(record.allowed_models, tenant.allowed_models),
    )


def claims_principal(
    claims: Mapping[str, Any],  # Any: JSON claim values
    settings: OidcSettings,
    roles: Mapping[str, frozenset[Scope]],
    policy: Policy,
) -> Principal:
    """An OIDC principal: `sub`, scopes from the scope and roles claims, the tenant claim
    (or `default_tenant`), and the tenant's rights. Raises TokenRejected."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not 0 < len(subject) <= 256:
        raise TokenRejected("bad subject")
    tenant_name = claims.get(settings.tenant_claim, settings.default_tenant)
    if not isinstance(tenant_name, str) or not _valid_name(tenant_name):
        raise TokenRejected("missing or invalid tenant claim")
    names = _claim_values(claims.get(settings.scope_claim))
    scopes = {Scope(n) for n in names if n in _SCOPE_NAMES}
    for role in _claim_values(claims.get(settings.roles_claim)):
        scopes |= roles.get(role, frozenset())
    tenant = policy.tenant(tenant_name)
    return Principal(
        subject=subject,
        kind="oidc",
        tenant=tenant_name,
        scopes=frozenset(scopes),
        priority_cap=tenant.priority_cap,
        allowed_models=tenant.allowed_models,
    )


def _claim_values(value: object) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def _lower_cap(a: Any, b: Any) -> Any:  # Any: the priority literal (or None)
    caps = [c for c in (a, b) if c is not None]
    return min(caps, key=_PRIORITY_RANK.__getitem__) if caps else None


def _narrowed(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    if a is None or b is None:
        return a if b is None else b
    return a & b


class AuthenticationMiddleware:
    """Pure ASGI: deny by default; sets the principal for the rest of the request.

    `path_scopes` holds scope needs of routes that cannot declare them as a dependency
    (FastAPI's own /openapi.json and /docs pages); `render_error` turns a 401/403 into a
    response in the shape the path expects (OpenAI, or Ollama's under /api/); `sessions`
    the web console's (None: the console is off, a session cookie means nothing).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticator: Authenticator,
        public_paths: frozenset[str],
        path_scopes: Mapping[str, Scope],
        render_error: ErrorRenderer,
        sessions: CookieSessions | None = None,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.public_paths = public_paths
        self.path_scopes = path_scopes
        self.render_error = render_error
        self.sessions = sessions

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            principal, session = await self._principal(scope)
        except (Unauthorized, PermissionDenied) as exc:
            if scope["type"] == "websocket":
                await _refuse_handshake(exc, scope, receive, send)
                return
            await drain_body(receive, max_bytes=_DRAIN_MAX_BYTES, max_s=_DRAIN_MAX_S)
            await self.render_error(exc, scope.get("path", ""))(scope, receive, send)
            return
        context_of(scope).principal = principal
        tenant_token = tenant_var.set(principal.tenant)
        try:
            await self.app(scope, receive, send)
        finally:
            tenant_var.reset(tenant_token)
            if session is not None and self.sessions is not None:
                # NOTE: a long request (a model swap) is activity too: the idle timer
                # restarts at its end, not only at its start
                self.sessions.store.touch(session)

    async def _principal(self, scope: AsgiScope) -> tuple[Principal, Session | None]:
        """The request's principal, and the console session it came from (if any)."""
        if not self.authenticator.enabled:
            # Auth off: anonymous, unless a layer outside set a principal (tests that act
            # as distinct keys and tenants; nothing in the server does).
            preset = context_of(scope).principal
            return (preset if preset is not None else ANONYMOUS), None
        path = scope.get("path", "")
        sessions = self.sessions
        if path in self.public_paths or (
            sessions is not None and sessions.is_public(path, scope.get("method", ""))
        ):
            return UNAUTHENTICATED, None
        if _credential_in_query(scope.get("query_string", b"")):
            raise Unauthorized(
                "credentials in the URL are refused (URLs end up in logs and browser "
                "history): send Authorization: Bearer <key> or x-api-key"
            )
        credentials = bearer_credentials(scope["headers"])
        found = self._session_principal(scope, credentials)
        principal, session = found if found else (None, None)
        if principal is None:
            principal = await self.authenticator.authenticate(credentials)
        needed = self.path_scopes.get(path)
        if needed is not None and not principal.has_scope(needed):
            raise PermissionDenied(f"'{principal.subject}' lacks the '{needed}' scope")
        return principal, session

    def _session_principal(
        self, scope: AsgiScope, credentials: Credentials
    ) -> tuple[Principal, Session] | None:
        """The console session's principal and the session; None when the request sends a
        key or token (it wins) or no session cookie. Raises Unauthorized (no such session,
        a WebSocket, the key revoked) or CsrfRejected."""
        sessions = self.sessions
        if sessions is None or credentials != Credentials():
            return None
        session_id = sessions.session_id(scope["headers"])
        if session_id is None:
            return None
        if scope["type"] != "http":
            raise Unauthorized("a console session does not open WebSockets: send an API key")
        session = sessions.store.find(session_id)
        if session is None:
            raise Unauthorized("the console session expired or was signed out: sign in again")
        if not csrf_ok(session, scope.get("method", ""), scope["headers"]):
            raise CsrfRejected(
                "a console session's request that changes state needs its X-CSRF-Token header"
            )
        principal = self.authenticator.refresh(session.principal)
        if principal is None:
            sessions.store.close(session_id)
            raise Unauthorized("the key this console session signed in with is revoked or expired")
        return principal, session


async def _refuse_handshake(
    exc: Unauthorized | PermissionDenied, scope: AsgiScope, receive: Receive, send: Send
) -> None:
    """Refuse a WebSocket upgrade: an HTTP 401/403 with the OpenAI error body where the
    server can send one (the `websocket.http.response` extension), else close 1008."""
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps(exc.to_body()).encode()
        headers = [(b"content-type", b"application/json")]
        headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers().items()]
        start = {"type": "websocket.http.response.start", "status": exc.http_status}
        await send({**start, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})


def _credential_in_query(query: bytes) -> bool:
    if not query:
        return False
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return any(name.lower() in CREDENTIAL_QUERY_PARAMS for name, _ in pairs)
