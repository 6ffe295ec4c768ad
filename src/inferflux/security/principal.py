"""`Principal`: the authenticated caller of one request, and where it lives on the ASGI scope.

The authentication middleware sets it (`set_principal`: on the scope's state and in
`principal_var`); everything inside (scope checks, rate limits, audit, routes) reads it
with `get_principal(scope)`, and code without the scope (the engine wrapper that applies
guardrails and token limits) with `current_principal()`. With auth off every
request runs as `ANONYMOUS`, which holds every scope in the `default` tenant.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from starlette.types import Scope as AsgiScope

_STATE_KEY = "principal"


class Scope(StrEnum):
    """RBAC scopes (spec: admin, read, generate, adapter-manager)."""

    ADMIN = "admin"
    READ = "read"
    GENERATE = "generate"
    ADAPTER_MANAGER = "adapter-manager"


ALL_SCOPES: frozenset[Scope] = frozenset(Scope)

PrincipalKind = Literal["api_key", "oidc", "anonymous"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. `subject` is the key id (api_key) or the token's `sub` (oidc), never
    a secret. `allowed_models` None means every model; `priority_cap` None means no cap."""

    subject: str
    kind: PrincipalKind
    tenant: str
    scopes: frozenset[Scope]
    rate_limit_tier: str | None = None
    priority_cap: Literal["high", "normal", "low"] | None = None
    allowed_models: frozenset[str] | None = None

    def has_scope(self, scope: Scope) -> bool:
        return scope in self.scopes

    def may_use_model(self, model_id: str) -> bool:
        return self.allowed_models is None or model_id in self.allowed_models


ANONYMOUS = Principal(subject="anonymous", kind="anonymous", tenant="default", scopes=ALL_SCOPES)


principal_var: ContextVar[Principal | None] = ContextVar("inferflux_principal", default=None)


def set_principal(scope: AsgiScope, principal: Principal) -> None:
    """Record `principal` for this request. The caller (the authn middleware) also sets
    `principal_var` around the inner app and resets it after."""
    scope.setdefault("state", {})[_STATE_KEY] = principal


def current_principal() -> Principal:
    """The principal of the request this task serves (from `principal_var`). Raises
    LookupError outside a request that went through authentication."""
    principal = principal_var.get()
    if principal is None:
        raise LookupError("no principal in this context: the auth middleware did not run")
    return principal


def get_principal(scope: AsgiScope) -> Principal:
    """The request's principal. Raises LookupError when authentication never ran: a route
    outside the middleware stack is a bug, and must not silently run as anonymous."""
    principal = scope.get("state", {}).get(_STATE_KEY)
    if principal is None:
        raise LookupError("no principal on this request: the auth middleware did not run")
    assert isinstance(principal, Principal)
    return principal
