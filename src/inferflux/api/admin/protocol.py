"""Pydantic bodies of the admin API (the HTTP edge only) and their mapping to policy data.

Strict like the OpenAI bodies: unknown fields are refused, JSON types are not coerced,
every list and string has a bound. Views (what GET returns) are plain dicts built here,
so no digest or secret can slip into a response by accident: `key_view` names each field.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferflux.config.auth_settings import PriorityName, ScopeName
from inferflux.config.policy_schema import (
    MAX_REGEXES,
    GuardrailRules,
    LimitFields,
    Name,
)
from inferflux.security.guardrails.chain import invalid_patterns
from inferflux.security.policy import (
    ApiKeyRecord,
    GuardrailPolicy,
    RateLimits,
    TenantPolicy,
    to_guardrail_policy,
    to_rate_limits,
)

ModelId = Annotated[str, Field(min_length=1, max_length=256)]
MAX_MODELS = 256
MAX_TIERS = 100


_STRICT = ConfigDict(extra="forbid", strict=True)


class _Body(BaseModel):
    model_config = _STRICT


class LimitsBody(LimitFields):
    """`LimitFields` (config/policy_schema.py), with strict JSON types."""

    model_config = _STRICT

    def to_limits(self) -> RateLimits:
        return to_rate_limits(self)


class CreateKeyBody(_Body):
    name: str = Field("", max_length=128)
    tenant: Name = "default"
    scopes: list[ScopeName] = Field(default_factory=list, max_length=8)
    roles: list[Name] = Field(default_factory=list, max_length=32)
    limits: LimitsBody | None = None
    rate_limit_tier: Name | None = None
    priority_cap: PriorityName | None = None
    allowed_models: list[ModelId] | None = Field(None, max_length=MAX_MODELS)
    expires_in_s: float | None = Field(None, gt=0, le=10 * 366 * 86_400)

    @model_validator(mode="after")
    def _some_scope(self) -> Self:
        if not self.scopes and not self.roles:
            raise ValueError("give the key `scopes` or `roles`")
        return self


class TenantFields(_Body):
    limits: LimitsBody | None = None
    allowed_models: list[ModelId] | None = Field(None, max_length=MAX_MODELS)
    priority_cap: PriorityName | None = None
    share_prefix_cache: bool = False

    def to_tenant(self, name: str, default_limits: RateLimits) -> TenantPolicy:
        return TenantPolicy(
            tenant=name,
            limits=self.limits.to_limits() if self.limits else default_limits,
            allowed_models=_models(self.allowed_models),
            priority_cap=self.priority_cap,
            share_prefix_cache=self.share_prefix_cache,
        )


class CreateTenantBody(TenantFields):
    name: Name


class RateLimitBody(_Body):
    """A partial update: only the parts given change. A tier set to null is removed."""

    default: LimitsBody | None = None
    tiers: dict[Name, LimitsBody | None] | None = Field(None, max_length=MAX_TIERS)
    tenants: dict[Name, LimitsBody] | None = Field(None, max_length=10_000)


class GuardrailsBody(GuardrailRules):
    """The whole guardrail policy (PUT replaces it): `GuardrailRules`, the config file's
    declaration, with strict JSON types. A pattern RE2 cannot run is a 422 naming it."""

    model_config = _STRICT

    # what GET reports (read-only, ignored): a GET body PUT back as it is stays valid
    invalid_blocklist_regex: list[str] | None = Field(None, max_length=MAX_REGEXES)

    def to_policy(self) -> GuardrailPolicy:
        return to_guardrail_policy(self)


def _models(models: list[str] | None) -> frozenset[str] | None:
    return None if models is None else frozenset(models)


def limits_view(limits: RateLimits | None) -> dict[str, int | None] | None:
    if limits is None:
        return None
    return {
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "max_concurrent": limits.max_concurrent,
    }


def key_view(record: ApiKeyRecord, source: str) -> dict[str, object]:
    """An API key as the admin API shows it: never the digest, never a secret."""
    return {
        "id": record.key_id,
        "object": "api_key",
        "name": record.name,
        "tenant": record.tenant,
        "scopes": sorted(record.scopes),
        "limits": limits_view(record.limits),
        "rate_limit_tier": record.rate_limit_tier,
        "priority_cap": record.priority_cap,
        "allowed_models": _sorted(record.allowed_models),
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "revoked": record.revoked,
        "source": source,
    }


def tenant_view(tenant: TenantPolicy, num_active_keys: int) -> dict[str, object]:
    return {
        "name": tenant.tenant,
        "object": "tenant",
        "limits": limits_view(tenant.limits),
        "allowed_models": _sorted(tenant.allowed_models),
        "priority_cap": tenant.priority_cap,
        "share_prefix_cache": tenant.share_prefix_cache,
        "num_active_keys": num_active_keys,
    }


def guardrails_view(guardrails: GuardrailPolicy) -> dict[str, object]:
    return {
        "blocklist": list(guardrails.blocklist),
        "blocklist_regex": list(guardrails.blocklist_regex),
        # skipped until replaced: only an old store can hold them (guardrails/chain.py)
        "invalid_blocklist_regex": invalid_patterns(guardrails.blocklist_regex),
        "pii_action": guardrails.pii_action,
        "opa_endpoint": guardrails.opa_endpoint,
        "opa_fail_open": guardrails.opa_fail_open,
    }


def _sorted(values: frozenset[str] | None) -> list[str] | None:
    return None if values is None else sorted(values)
