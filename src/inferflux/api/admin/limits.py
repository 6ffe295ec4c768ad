"""/v1/admin/rate_limit and /v1/admin/guardrails: the policy's limits and guardrail
settings, read and changed at runtime (effective from the next request, persisted in the
policy store when one is configured)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Request

from inferflux.api.admin.changes import SecurityDep, apply_change
from inferflux.api.admin.protocol import (
    GuardrailsBody,
    RateLimitBody,
    guardrails_view,
    limits_view,
)
from inferflux.api.admin.tenants import with_tenant
from inferflux.api.deps import json_body
from inferflux.errors import NotFound
from inferflux.security.policy import Policy

router = APIRouter(prefix="/v1/admin", tags=["admin"])
RateLimitUpdate = Annotated[RateLimitBody, Depends(json_body(RateLimitBody))]
GuardrailsUpdate = Annotated[GuardrailsBody, Depends(json_body(GuardrailsBody))]


def rate_limit_view(policy: Policy) -> dict[str, object]:
    return {
        "default": limits_view(policy.default_limits),
        "tiers": {name: limits_view(limits) for name, limits in policy.tiers},
        "tenants": {t.tenant: limits_view(t.limits) for t in policy.tenants},
    }


@router.get("/rate_limit")
async def get_rate_limit(security: SecurityDep) -> dict[str, object]:
    """Default limits, tier limits and per-tenant limits."""
    return rate_limit_view(security.policy.current())


@router.put("/rate_limit")
async def put_rate_limit(
    request: Request, body: RateLimitUpdate, security: SecurityDep
) -> dict[str, object]:
    """Change the parts given: `default`, tiers (null removes one), tenants' limits (the
    tenants must exist: POST /v1/admin/tenants)."""

    def update(policy: Policy) -> Policy:
        if body.default is not None:
            policy = replace(policy, default_limits=body.default.to_limits())
        if body.tiers is not None:
            tiers = dict(policy.tiers)
            for name, limits in body.tiers.items():
                if limits is None:
                    tiers.pop(name, None)
                else:
                    tiers[name] = limits.to_limits()
            policy = replace(policy, tiers=tuple(sorted(tiers.items())))
        for name, limits in (body.tenants or {}).items():
            tenant = next((t for t in policy.tenants if t.tenant == name), None)
            if tenant is None:
                raise NotFound(f"no tenant '{name}'; create it with POST /v1/admin/tenants")
            policy = with_tenant(policy, replace(tenant, limits=limits.to_limits()))
        return policy

    changed = sorted(body.model_dump(exclude_none=True))
    policy = await apply_change(request, security, f"rate_limit.update:{','.join(changed)}", update)
    return rate_limit_view(policy)


@router.get("/guardrails")
async def get_guardrails(security: SecurityDep) -> dict[str, object]:
    """The guardrail settings the admin API controls."""
    return guardrails_view(security.policy.current().guardrails)


@router.put("/guardrails")
async def put_guardrails(
    request: Request, body: GuardrailsUpdate, security: SecurityDep
) -> dict[str, object]:
    """Replace the guardrail settings (fields left out get their defaults). A pattern the
    guardrails' regex engine cannot run is a 422 (the body's check), and nothing is
    stored."""
    guardrails = body.to_policy()
    policy = await apply_change(
        request, security, "guardrails.update", lambda p: replace(p, guardrails=guardrails)
    )
    return guardrails_view(policy.guardrails)
