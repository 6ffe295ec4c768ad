"""Security: who is calling (`Principal`), what they may do (scopes, policy), and the
pure-ASGI middleware that enforce it (DESIGN.md §4). Never imports `engine`."""

from inferflux.security.policy import (
    ApiKeyRecord,
    GuardrailPolicy,
    Policy,
    PolicySource,
    RateLimits,
    StaticPolicySource,
    TenantPolicy,
)
from inferflux.security.principal import (
    ANONYMOUS,
    Principal,
    Scope,
    current_principal,
    get_principal,
    principal_var,
    set_principal,
)
from inferflux.security.request_record import RequestRecord, get_request_record

__all__ = [
    "ANONYMOUS",
    "ApiKeyRecord",
    "GuardrailPolicy",
    "Policy",
    "PolicySource",
    "Principal",
    "RateLimits",
    "RequestRecord",
    "Scope",
    "StaticPolicySource",
    "TenantPolicy",
    "current_principal",
    "get_principal",
    "get_request_record",
    "principal_var",
    "set_principal",
]
