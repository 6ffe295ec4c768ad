"""The parts of the base `Policy` that come from settings (before any admin change):
`default_limits` and `tiers` from `rate_limit`, `guardrails` from `guardrails`.

The app combines them with the keys and tenants of the authentication settings / the
policy store (`base_policy` takes those as arguments).
"""

from __future__ import annotations

from inferflux.config.security_settings import RateLimitSettings
from inferflux.config.settings import Settings
from inferflux.security.policy import (
    ApiKeyRecord,
    Policy,
    RateLimits,
    TenantPolicy,
    to_guardrail_policy,
    to_rate_limits,
)


def rate_limit_policy(
    settings: RateLimitSettings,
) -> tuple[RateLimits, tuple[tuple[str, RateLimits], ...]]:
    """(default_limits, tiers) of `Policy`."""
    tiers = tuple((name, to_rate_limits(tier)) for name, tier in sorted(settings.tiers.items()))
    return to_rate_limits(settings), tiers


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
        guardrails=to_guardrail_policy(settings.guardrails),
    )
