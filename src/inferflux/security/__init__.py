"""Security: who is calling (`Principal`), what they may do (scopes, policy), the request's
context and record (`RequestContext`), and the pure-ASGI middleware that enforce it
(docs/architecture.md, "A request's path"). Never imports `engine`."""

from inferflux.security.context import RequestContext, RequestRecord, context_of
from inferflux.security.policy import (
    ApiKeyRecord,
    GuardrailPolicy,
    Policy,
    PolicySource,
    RateLimits,
    StaticPolicySource,
    TenantPolicy,
)
from inferflux.security.principal import ANONYMOUS, Principal, Scope

__all__ = [
    "ANONYMOUS",
    "ApiKeyRecord",
    "GuardrailPolicy",
    "Policy",
    "PolicySource",
    "Principal",
    "RateLimits",
    "RequestContext",
    "RequestRecord",
    "Scope",
    "StaticPolicySource",
    "TenantPolicy",
    "context_of",
]
