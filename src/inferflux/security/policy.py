"""The policy data model: API keys (digests only), tenants, rate limits, guardrail settings.

These are values, not schemas: what the config file and the admin API accept (fields,
bounds, checks) is declared once in `config/policy_schema.py`, and `to_rate_limits` /
`to_guardrail_policy` build the values from it.

`Policy` is an immutable snapshot. A `PolicySource` hands out the current one; the
encrypted policy store and the admin API replace it atomically, so readers (authn, rate
limiter, guardrails) take `source.current()` per decision and see changes without restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from inferflux.config.policy_schema import GuardrailRules, LimitFields, PiiAction
from inferflux.security.principal import Scope


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Limits of one key, tenant or tier. None = unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """One API key. `digest` is the hex SHA-256 (or HMAC-SHA-256 with the pepper) of the
    key; the plaintext is never stored. `key_id` is public (shown in lists and logs)."""

    key_id: str
    digest: str
    tenant: str
    scopes: frozenset[Scope]
    limits: RateLimits | None = None  # None: the tenant's (or the tier's) limits
    rate_limit_tier: str | None = None
    priority_cap: Literal["high", "normal", "low"] | None = None
    allowed_models: frozenset[str] | None = None
    name: str = ""
    created_at: float = 0.0  # Unix time
    expires_at: float | None = None
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    tenant: str
    limits: RateLimits = field(default_factory=RateLimits)
    allowed_models: frozenset[str] | None = None
    priority_cap: Literal["high", "normal", "low"] | None = None
    share_prefix_cache: bool = False  # opt-in: share cached prefixes with other tenants


@dataclass(frozen=True, slots=True)
class GuardrailPolicy:
    """Guardrail settings that the admin API may change at runtime."""

    blocklist: tuple[str, ...] = ()  # words (case-insensitive, whole word)
    blocklist_regex: tuple[str, ...] = ()
    pii_action: PiiAction = "off"
    opa_endpoint: str | None = None
    opa_fail_open: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    """One consistent snapshot of everything the security layer decides with."""

    keys: tuple[ApiKeyRecord, ...] = ()
    tenants: tuple[TenantPolicy, ...] = ()
    tiers: tuple[tuple[str, RateLimits], ...] = ()  # rate_limit_tier name → limits
    default_limits: RateLimits = field(default_factory=RateLimits)
    guardrails: GuardrailPolicy = field(default_factory=GuardrailPolicy)
    version: int = 0

    def tenant(self, name: str) -> TenantPolicy:
        for tenant in self.tenants:
            if tenant.tenant == name:
                return tenant
        return TenantPolicy(tenant=name, limits=self.default_limits)


def to_rate_limits(fields: LimitFields) -> RateLimits:
    return RateLimits(fields.requests_per_minute, fields.tokens_per_minute, fields.max_concurrent)


def to_guardrail_policy(rules: GuardrailRules) -> GuardrailPolicy:
    return GuardrailPolicy(
        blocklist=tuple(rules.blocklist),
        blocklist_regex=tuple(rules.blocklist_regex),
        pii_action=rules.pii_action,
        opa_endpoint=rules.opa_endpoint,
        opa_fail_open=rules.opa_fail_open,
    )


class PolicySource(Protocol):
    """Where the current policy comes from (the encrypted store, or settings alone)."""

    def current(self) -> Policy: ...


class StaticPolicySource:
    """A fixed policy (config only, no store). Also what unit tests hand in."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    def current(self) -> Policy:
        return self._policy
