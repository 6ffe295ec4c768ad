"""/v1/admin/tenants: create, list, show, replace and delete tenants.

A tenant nobody configured still exists implicitly (keys may name it) with the default
limits; creating it here gives it its own limits, models and priority cap. A tenant that
active keys still name cannot be deleted (409): revoke its keys first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse

from inferflux.api.admin.changes import SecurityDep, apply_change
from inferflux.api.admin.checks import check_models
from inferflux.api.admin.protocol import CreateTenantBody, TenantFields, tenant_view
from inferflux.api.deps import json_body
from inferflux.errors import Conflict, NotFound
from inferflux.security.policy import Policy, TenantPolicy

router = APIRouter(prefix="/v1/admin/tenants", tags=["admin"])
CreateTenant = Annotated[CreateTenantBody, Depends(json_body(CreateTenantBody))]
UpdateTenant = Annotated[TenantFields, Depends(json_body(TenantFields))]


def _active_keys(policy: Policy, tenant: str) -> int:
    return sum(1 for k in policy.keys if k.tenant == tenant and not k.revoked)


@router.get("")
async def list_tenants(security: SecurityDep) -> dict[str, object]:
    """Every configured tenant with its limits and number of active keys."""
    policy = security.policy.current()
    return {
        "object": "list",
        "data": [tenant_view(t, _active_keys(policy, t.tenant)) for t in policy.tenants],
    }


@router.get("/{name}")
async def get_tenant(name: str, security: SecurityDep) -> dict[str, object]:
    policy = security.policy.current()
    return tenant_view(_find(policy, name), _active_keys(policy, name))


@router.post("", status_code=201)
async def create_tenant(
    request: Request, body: CreateTenant, security: SecurityDep
) -> JSONResponse:
    """A new tenant; 409 when one of that name exists."""
    check_models(body.allowed_models, "allowed_models")

    def create(policy: Policy) -> Policy:
        if any(t.tenant == body.name for t in policy.tenants):
            raise Conflict(f"tenant '{body.name}' exists; PUT /v1/admin/tenants/{body.name}")
        tenant = body.to_tenant(body.name, policy.default_limits)
        return replace(policy, tenants=(*policy.tenants, tenant))

    policy = await apply_change(request, security, f"tenant.create:{body.name}", create)
    view = tenant_view(_find(policy, body.name), _active_keys(policy, body.name))
    return JSONResponse(view, status_code=201)


@router.put("/{name}")
async def replace_tenant(
    request: Request, name: str, body: UpdateTenant, security: SecurityDep
) -> dict[str, object]:
    """Replace a tenant's settings (fields left out get their defaults)."""
    check_models(body.allowed_models, "allowed_models")

    def update(policy: Policy) -> Policy:
        _find(policy, name)
        tenant = body.to_tenant(name, policy.default_limits)
        return with_tenant(policy, tenant)

    policy = await apply_change(request, security, f"tenant.update:{name}", update)
    return tenant_view(_find(policy, name), _active_keys(policy, name))


@router.delete("/{name}")
async def delete_tenant(request: Request, name: str, security: SecurityDep) -> dict[str, object]:
    """Delete a tenant that no active key names."""

    def delete(policy: Policy) -> Policy:
        _find(policy, name)
        active = _active_keys(policy, name)
        if active:
            raise Conflict(f"tenant '{name}' still has {active} active key(s); revoke them first")
        return replace(policy, tenants=tuple(t for t in policy.tenants if t.tenant != name))

    await apply_change(request, security, f"tenant.delete:{name}", delete)
    return {"name": name, "object": "tenant", "deleted": True}


def _find(policy: Policy, name: str) -> TenantPolicy:
    for tenant in policy.tenants:
        if tenant.tenant == name:
            return tenant
    raise NotFound(f"no tenant '{name}' (GET /v1/admin/tenants lists them)", param="name")


def with_tenant(policy: Policy, tenant: TenantPolicy) -> Policy:
    """`policy` with `tenant` replacing the one of the same name."""
    tenants = tuple(tenant if t.tenant == tenant.tenant else t for t in policy.tenants)
    return replace(policy, tenants=tenants)
