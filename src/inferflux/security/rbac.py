"""Authorization: scopes per route, the role → scopes table, model rights.

Owns: `require_scope(scope)` (the FastAPI dependency each router is included with in
`api/app.py`; 401 for the unauthenticated, 403 for a missing scope), `required_scope`
(which scope a dependency demands: the route-coverage test reads it), `roles_table`,
`authorize_model` (403 for a model outside the principal's `allowed_models`) and
`UNAUTHENTICATED` (the principal of a public route while authentication is on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fastapi import Depends
from fastapi.params import Depends as DependsParam
from starlette.exceptions import WebSocketException
from starlette.requests import HTTPConnection
from starlette.status import WS_1008_POLICY_VIOLATION

from inferflux.errors import PermissionDenied, Unauthorized
from inferflux.security.context import context_of
from inferflux.security.principal import Principal, Scope

UNAUTHENTICATED = Principal(
    subject="unauthenticated", kind="anonymous", tenant="default", scopes=frozenset()
)

_SCOPE_ATTR = "__inferflux_required_scope__"


def require_scope(scope: Scope) -> DependsParam:
    """A route dependency: the request's principal must hold `scope`. A WebSocket
    handshake that fails is refused with close code 1008 (policy violation), which the
    client sees as an HTTP 403."""

    async def check(connection: HTTPConnection) -> None:
        principal = context_of(connection.scope).caller
        error: Unauthorized | PermissionDenied | None = None
        if principal is UNAUTHENTICATED:
            error = Unauthorized("authentication required: send Authorization: Bearer <key>")
        elif not principal.has_scope(scope):
            error = PermissionDenied(
                f"'{principal.subject}' lacks the '{scope}' scope this route needs "
                f"(it has: {', '.join(sorted(principal.scopes)) or 'none'})"
            )
        if error is not None and connection.scope["type"] == "websocket":
            raise WebSocketException(WS_1008_POLICY_VIOLATION, error.message[:120])
        if error is not None:
            raise error

    setattr(check, _SCOPE_ATTR, scope)
    check.__name__ = f"require_{scope.replace('-', '_')}"
    dependency: DependsParam = Depends(check)
    return dependency


def required_scope(call: object) -> Scope | None:
    """The scope a `require_scope` dependency callable demands; None for anything else."""
    scope = getattr(call, _SCOPE_ATTR, None)
    return scope if isinstance(scope, Scope) else None


def roles_table(roles: Mapping[str, Iterable[str]]) -> dict[str, frozenset[Scope]]:
    """Role name → scopes (`auth.roles`)."""
    return {name: frozenset(Scope(s) for s in scopes) for name, scopes in roles.items()}


def authorize_model(principal: Principal, *names: str) -> None:
    """Raise PermissionDenied unless `principal` may use the model known by any of
    `names` (its id, or its Ollama name). Call where a request's model is resolved."""
    if not any(principal.may_use_model(name) for name in names):
        raise PermissionDenied(
            f"'{principal.subject}' may not use the model '{names[0]}' (allowed_models)",
            param="model",
        )
