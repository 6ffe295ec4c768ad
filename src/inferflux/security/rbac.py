"""Authorization: scopes per route, the role → scopes table, model rights.

Owns: `require_scope(scope)` (the FastAPI dependency each router is included with in
`api/app.py`; 401 for the unauthenticated, 403 for a missing scope), `required_scope`
(which scope a dependency demands: the route-coverage test reads it), `roles_table`,
`authorize_model` (403 for a model outside the principal's `allowed_models`) and
`UNAUTHENTICATED` (the principal of a public route while authentication is on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fastapi import Depends, Request
from fastapi.params import Depends as DependsParam

from inferflux.errors import PermissionDenied, Unauthorized
from inferflux.security.context import context_of
from inferflux.security.principal import Principal, Scope

UNAUTHENTICATED = Principal(
    subject="unauthenticated", kind="anonymous", tenant="default", scopes=frozenset()
)

_SCOPE_ATTR = "__inferflux_required_scope__"


def require_scope(scope: Scope) -> DependsParam:
    """A route dependency: the request's principal must hold `scope`."""

    async def check(request: Request) -> None:
        principal = context_of(request.scope).caller
        if principal is UNAUTHENTICATED:
            raise Unauthorized("authentication required: send Authorization: Bearer <key>")
        if not principal.has_scope(scope):
            raise PermissionDenied(
                f"'{principal.subject}' lacks the '{scope}' scope this route needs "
                f"(it has: {', '.join(sorted(principal.scopes)) or 'none'})"
            )

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
