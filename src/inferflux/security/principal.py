"""`Principal`: the authenticated caller of one request.

The authentication middleware sets it on the request's `RequestContext`
(security/context.py); everything inside reads it from there: middleware and scope checks
from the ASGI scope's context, the routes and the engine wrappers from the context they
are handed. With auth off every request runs as `ANONYMOUS`, which holds every scope in the
`default` tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


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
