"""The parts of the base `Policy` that come from settings (before any admin change):
`default_limits` and `tiers` from `rate_limit`, `guardrails` from `guardrails`.

The app combines them with the keys and tenants of the authentication settings / the
policy store (`base_policy` takes those as arguments).
"""

from __future__ import annotations

from inferflux.config.security_settings import GuardrailSettings, LimitSettings, RateLimitSettings
from inferflux.config.settings import Settings
from inferflux.security.policy import (
    ApiKeyRecord,
    GuardrailPolicy,
    Policy,
    RateLimits,
    TenantPolicy,
)


def _limits(settings: LimitSettings | RateLimitSettings) -> RateLimits:
    return RateLimits(
        requests_per_minute=settings.requests_per_minute,
        tokens_per_minute=settings.tokens_per_minute,
        max_concurrent=settings.max_concurrent,
    )


def rate_limit_policy(
    settings: RateLimitSettings,
) -> tuple[RateLimits, tuple[tuple[str, RateLimits], ...]]:
    """(default_limits, tiers) of `Policy`."""
    tiers = tuple((name, _limits(tier)) for name, tier in sorted(settings.tiers.items()))
    return _limits(settings), tiers


def guardrail_policy(settings: GuardrailSettings) -> GuardrailPolicy:
    return GuardrailPolicy(
        blocklist=tuple(settings.blocklist),
        blocklist_regex=tuple(settings.blocklist_regex),
        pii_action=settings.pii,
        opa_endpoint=settings.opa_endpoint,
        opa_fail_open=settings.opa_fail_open,
    )


def base_policy(
    settings: Settings,
    keys: tuple[ApiKeyRecord, ...] = (),
    tenants: tuple[TenantPolicy, ...] = (),
) -> Policy:
    """The policy `settings` describe, with `keys` and `tenants` from authentication."""
    default_limits, tiers = rate_limit_policy(settings.rate_limit)
    return Policy(
        keys=keys,
        tenants=tenants,
        tiers=tiers,
        default_limits=default_limits,
        guardrails=guardrail_policy(settings.guardrails),
    )
