"""Which limits apply to a principal, the x-ratelimit-* headers, and admission over the
in-memory limiter."""

from __future__ import annotations

import pytest

from inferflux.config.security_settings import RateLimitSettings
from inferflux.errors import RateLimited
from inferflux.security.policy import (
    ApiKeyRecord,
    Policy,
    RateLimits,
    StaticPolicySource,
    TenantPolicy,
)
from inferflux.security.principal import Principal, Scope
from inferflux.security.rate_limit import (
    LocalLimiter,
    RateLimitService,
    RateLimitStatus,
    targets_for,
)
from inferflux.security.rate_limit.service import duration

GEN = frozenset({Scope.GENERATE})


def key_principal(key_id: str, tenant: str = "acme", tier: str | None = None) -> Principal:
    return Principal(key_id, "api_key", tenant, GEN, rate_limit_tier=tier)


POLICY = Policy(
    keys=(
        ApiKeyRecord("own", "d", "acme", GEN, limits=RateLimits(requests_per_minute=5)),
        ApiKeyRecord("tiered", "d", "acme", GEN, rate_limit_tier="gold"),
    ),
    tenants=(TenantPolicy("acme", limits=RateLimits(tokens_per_minute=1000)),),
    tiers=(("gold", RateLimits(requests_per_minute=50)),),
    default_limits=RateLimits(requests_per_minute=2),
)


def test_key_limits_then_tier_then_defaults_and_listed_tenants_only():
    own = targets_for(key_principal("own"), POLICY)
    assert [(t.scope, t.limits.requests_per_minute) for t in own] == [("key", 5), ("tenant", None)]
    assert targets_for(key_principal("tiered"), POLICY)[0].limits.requests_per_minute == 50
    assert (
        targets_for(key_principal("other", tier="gold"), POLICY)[0].limits.requests_per_minute == 50
    )
    oidc = Principal("sub", "oidc", "elsewhere", GEN)
    assert [(t.scope, t.limits.requests_per_minute) for t in targets_for(oidc, POLICY)] == [
        ("key", 2)
    ]
    assert targets_for(oidc, Policy()) == ()


def test_reset_durations_in_openai_format():
    assert [duration(s) for s in (0.02, 1.5, 12.0, 360.0)] == ["20ms", "1.5s", "12s", "6m0s"]


async def test_admission_prompt_tokens_and_headers():
    service = RateLimitService(LocalLimiter(), StaticPolicySource(POLICY), RateLimitSettings())
    principal = key_principal("own")
    status = RateLimitStatus()
    await service.admit(principal, "m1", status)
    assert status.headers()["x-ratelimit-remaining-requests"] == "4"
    assert status.headers()["x-ratelimit-limit-tokens"] == "1000"
    await service.charge_prompt(principal, 600, status)
    assert status.headers()["x-ratelimit-remaining-tokens"] == "400"
    with pytest.raises(RateLimited) as refused:
        await service.charge_prompt(principal, 600, status)
    assert refused.value.headers()["retry-after"] == "12"
    assert "tenant" in refused.value.message
    with pytest.raises(RateLimited, match="exceed"):
        await service.charge_prompt(principal, 5000, status)
    await service.charge_completion(principal, 400, status)
    assert status.tokens is not None and status.tokens.remaining == 0


async def test_disabled_limits_admit_everything():
    settings = RateLimitSettings(enabled=False)
    service = RateLimitService(LocalLimiter(), StaticPolicySource(POLICY), settings)
    for _ in range(10):
        await service.admit(key_principal("own"), "m", RateLimitStatus())
