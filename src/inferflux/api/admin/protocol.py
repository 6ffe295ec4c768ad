"""Pydantic bodies of the admin API (the HTTP edge only) and their mapping to policy data.

Strict like the OpenAI bodies: unknown fields are refused, JSON types are not coerced,
every list and string has a bound. Views (what GET returns) are plain dicts built here,
so no digest or secret can slip into a response by accident: `key_view` names each field.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferflux.config.auth_settings import NAME_PATTERN, PriorityName, ScopeName
from inferflux.security.guardrails.chain import invalid_patterns
from inferflux.security.policy import ApiKeyRecord, GuardrailPolicy, RateLimits, TenantPolicy

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
ModelId = Annotated[str, Field(min_length=1, max_length=256)]
MAX_MODELS = 256
MAX_BLOCKLIST = 10_000
MAX_REGEXES = 1_000
MAX_TIERS = 100


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LimitsBody(_Body):
    requests_per_minute: int | None = Field(None, ge=1, le=10_000_000)
    tokens_per_minute: int | None = Field(None, ge=1, le=10_000_000_000)
    max_concurrent: int | None = Field(None, ge=1, le=100_000)

    def to_limits(self) -> RateLimits:
        return RateLimits(self.requests_per_minute, self.tokens_per_minute, self.max_concurrent)


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


class GuardrailsBody(_Body):
    """The whole guardrail policy (PUT replaces it)."""

    blocklist: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=MAX_BLOCKLIST
    )
    blocklist_regex: list[Annotated[str, Field(min_length=1, max_length=1024)]] = Field(
        default_factory=list, max_length=MAX_REGEXES
    )
    pii_action: Literal["off", "redact", "block"] = "off"
    opa_endpoint: str | None = Field(None, max_length=2048)
    opa_fail_open: bool = False
    # what GET reports (read-only, ignored): a GET body PUT back as it is stays valid
    invalid_blocklist_regex: list[str] | None = Field(None, max_length=MAX_REGEXES)

    @field_validator("blocklist_regex")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        """Malformed in any regex syntax: 400. Well-formed but beyond RE2, the engine that
        runs them (a backreference, lookaround): 422, in `api/admin/checks.py`."""
        for index, pattern in enumerate(patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"blocklist_regex[{index}] does not compile: {exc}") from None
        return patterns

    @field_validator("opa_endpoint")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("opa_endpoint must be an http:// or https:// URL")
        return url

    def to_policy(self) -> GuardrailPolicy:
        return GuardrailPolicy(
            blocklist=tuple(self.blocklist),
            blocklist_regex=tuple(self.blocklist_regex),
            pii_action=self.pii_action,
            opa_endpoint=self.opa_endpoint,
            opa_fail_open=self.opa_fail_open,
        )


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
