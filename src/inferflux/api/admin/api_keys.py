"""/v1/admin/api_keys: create (the plaintext shown once), list, show, revoke, rotate.

Keys are stored as digests only; the plaintext exists in the create and rotate responses
and nowhere else. Revoking keeps the record (marked revoked) so the server never turns
authentication off by losing its last key. Keys from the config file (`source: config`)
are listed but cannot be revoked or rotated here: change the config.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse

from inferflux.api.admin.changes import SecurityDep, apply_change
from inferflux.api.admin.checks import check_key
from inferflux.api.admin.protocol import CreateKeyBody, key_view
from inferflux.api.deps import json_body
from inferflux.api.security_layer import SecurityState
from inferflux.errors import Conflict, InvalidRequest, NotFound
from inferflux.security.api_keys import generate_api_key
from inferflux.security.policy import ApiKeyRecord, Policy
from inferflux.security.principal import Scope

router = APIRouter(prefix="/v1/admin/api_keys", tags=["admin"])
CreateKey = Annotated[CreateKeyBody, Depends(json_body(CreateKeyBody))]


def _source(security: SecurityState, key_id: str) -> str:
    return "config" if security.policy.is_config_key(key_id) else "store"


@router.get("")
async def list_keys(security: SecurityDep, tenant: str | None = None) -> dict[str, object]:
    """Every key (revoked ones included), without secrets or digests; `?tenant=` filters."""
    keys = security.policy.current().keys
    return {
        "object": "list",
        "data": [
            key_view(k, _source(security, k.key_id))
            for k in keys
            if tenant is None or k.tenant == tenant
        ],
    }


@router.get("/{key_id}")
async def get_key(key_id: str, security: SecurityDep) -> dict[str, object]:
    """One key by id, without its secret or digest."""
    return key_view(_find(security.policy.current(), key_id), _source(security, key_id))


@router.post("", status_code=201)
async def create_key(request: Request, body: CreateKey, security: SecurityDep) -> JSONResponse:
    """A new key. The response holds the plaintext `key`: shown this once, never again."""
    unknown = [role for role in body.roles if role not in security.roles]
    if unknown:
        raise InvalidRequest(f"unknown role(s) {unknown}; roles: {sorted(security.roles)}")
    check_key(body, security.policy.current())
    scopes = frozenset(Scope(s) for s in body.scopes).union(
        *(security.roles[r] for r in body.roles)
    )
    new = generate_api_key()
    now = time.time()
    record = ApiKeyRecord(
        key_id=new.key_id,
        digest=security.digester.digest(new.secret),
        tenant=body.tenant,
        scopes=scopes,
        limits=body.limits.to_limits() if body.limits else None,
        rate_limit_tier=body.rate_limit_tier,
        priority_cap=body.priority_cap,
        allowed_models=None if body.allowed_models is None else frozenset(body.allowed_models),
        name=body.name,
        created_at=now,
        expires_at=None if body.expires_in_s is None else now + body.expires_in_s,
    )
    await apply_change(
        request,
        security,
        f"api_key.create:{record.key_id}",
        lambda p: replace(p, keys=(*p.keys, record)),
    )
    return JSONResponse({**key_view(record, "store"), "key": new.secret}, status_code=201)


@router.delete("/{key_id}")
async def revoke_key(request: Request, key_id: str, security: SecurityDep) -> dict[str, object]:
    """Revoke a key: it gets 401 from the next request on. Revoking twice is harmless."""
    _check_changeable(security, key_id)
    policy = await apply_change(
        request, security, f"api_key.revoke:{key_id}", lambda p: _revoked(p, key_id)
    )
    return key_view(_find(policy, key_id), "store")


@router.post("/{key_id}/rotate", status_code=201)
async def rotate_key(request: Request, key_id: str, security: SecurityDep) -> JSONResponse:
    """A new secret (and id) with the same rights; the old key is revoked at once."""
    _check_changeable(security, key_id)
    old = _find(security.policy.current(), key_id)
    if old.revoked:
        raise Conflict(f"key '{key_id}' is revoked; create a new key instead", param="key_id")
    new = generate_api_key()
    record = replace(
        old,
        key_id=new.key_id,
        digest=security.digester.digest(new.secret),
        created_at=time.time(),
    )

    def rotate(policy: Policy) -> Policy:
        revoked = _revoked(policy, key_id)
        return replace(revoked, keys=(*revoked.keys, record))

    await apply_change(request, security, f"api_key.rotate:{key_id}->{record.key_id}", rotate)
    body = {**key_view(record, "store"), "key": new.secret, "replaces": key_id}
    return JSONResponse(body, status_code=201)


def _find(policy: Policy, key_id: str) -> ApiKeyRecord:
    for record in policy.keys:
        if record.key_id == key_id:
            return record
    raise NotFound(f"no API key '{key_id}' (GET /v1/admin/api_keys lists them)", param="key_id")


def _check_changeable(security: SecurityState, key_id: str) -> None:
    if security.policy.is_config_key(key_id):
        raise Conflict(
            f"key '{key_id}' is defined in the config file (auth.api_keys); change it there",
            param="key_id",
        )


def _revoked(policy: Policy, key_id: str) -> Policy:
    _find(policy, key_id)  # NotFound inside the change: nothing is written
    keys = tuple(replace(k, revoked=True) if k.key_id == key_id else k for k in policy.keys)
    return replace(policy, keys=keys)
