"""The admin API on the real app: keys (create, list, rotate, revoke), tenants, rate limits,
guardrails; changes apply from the next request and persist in the encrypted store."""

from __future__ import annotations

import asyncio

import pytest

from inferflux.security.policy_store import PolicyStore
from tests.integration.security.conftest import KEYS, PASSPHRASE, SecuredApp

pytestmark = pytest.mark.model


def stored(secured: SecuredApp):
    return PolicyStore(secured.store_path, PASSPHRASE).load()


async def test_key_lifecycle_create_use_rotate_revoke(secured: SecuredApp):
    async with secured.client(KEYS["admin"]) as admin:
        created = await admin.post(
            "/v1/admin/api_keys",
            json={"name": "ci", "tenant": "acme", "scopes": ["read"], "priority_cap": "low"},
        )
        assert created.status_code == 201
        body = created.json()
        secret, key_id = body.pop("key"), body["id"]
        assert secret.startswith("sk-inf-") and body["scopes"] == ["read"]
        listed = await admin.get("/v1/admin/api_keys")
        one = await admin.get(f"/v1/admin/api_keys/{key_id}")
        digest = next(k.digest for k in stored(secured).keys if k.key_id == key_id)
        for response in (listed, one):
            assert secret not in response.text and digest not in response.text
            assert "digest" not in response.text
        assert one.json() == body
        assert {"admin": "config", key_id: "store"}.items() <= {
            k["id"]: k["source"] for k in listed.json()["data"]
        }.items()
        async with secured.client(secret) as user:
            assert (await user.get("/v1/models")).status_code == 200
            rotated = await admin.post(f"/v1/admin/api_keys/{key_id}/rotate")
            assert rotated.status_code == 201
            new = rotated.json()
            assert new["replaces"] == key_id and new["id"] != key_id
            assert new["scopes"] == ["read"] and new["priority_cap"] == "low"
            assert (await user.get("/v1/models")).status_code == 401
        assert (await admin.post(f"/v1/admin/api_keys/{key_id}/rotate")).status_code == 409
        async with secured.client(new["key"]) as user:
            assert (await user.get("/v1/models")).status_code == 200
            revoked = await admin.delete(f"/v1/admin/api_keys/{new['id']}")
            assert revoked.status_code == 200 and revoked.json()["revoked"] is True
            assert (await user.get("/v1/models")).status_code == 401
    keys = {k.key_id: k for k in stored(secured).keys}
    assert keys[key_id].revoked and keys[new["id"]].revoked
    assert "admin" not in keys  # config keys are never written to the store


async def test_key_errors(secured: SecuredApp):
    async with secured.client(KEYS["admin"]) as admin:
        assert (await admin.delete("/v1/admin/api_keys/admin")).status_code == 409
        assert (await admin.post("/v1/admin/api_keys/admin/rotate")).status_code == 409
        assert (await admin.delete("/v1/admin/api_keys/key_nope")).status_code == 404
        assert (await admin.get("/v1/admin/api_keys/key_nope")).status_code == 404
        bad = {
            "no scope": {"name": "x"},
            "unknown scope": {"scopes": ["root"]},
            "unknown role": {"roles": ["wizard"]},
            "bad tenant": {"scopes": ["read"], "tenant": "a b"},
            "string limit": {"scopes": ["read"], "limits": {"requests_per_minute": "5"}},
            "zero limit": {"scopes": ["read"], "limits": {"max_concurrent": 0}},
            "extra field": {"scopes": ["read"], "digest": "ab" * 32},
            "past expiry": {"scopes": ["read"], "expires_in_s": -1},
        }
        for name, body in bad.items():
            response = await admin.post("/v1/admin/api_keys", json=body)
            assert response.status_code == 400, name
            assert response.json()["error"]["type"] == "invalid_request_error"
        assert (await admin.post("/v1/admin/api_keys", content=b"{")).status_code == 400


async def test_an_expiring_key_stops_working(secured: SecuredApp):
    async with secured.client(KEYS["admin"]) as admin:
        created = await admin.post(
            "/v1/admin/api_keys", json={"scopes": ["read"], "expires_in_s": 1.5}
        )
    async with secured.client(created.json()["key"]) as user:
        assert (await user.get("/v1/models")).status_code == 200
        await asyncio.sleep(1.6)
        assert (await user.get("/v1/models")).status_code == 401


async def test_tenants_crud(secured: SecuredApp):
    async with secured.client(KEYS["admin"]) as admin:
        body = {"name": "initech", "limits": {"tokens_per_minute": 5000}, "priority_cap": "low"}
        created = await admin.post("/v1/admin/tenants", json=body)
        assert created.status_code == 201
        assert created.json()["limits"]["tokens_per_minute"] == 5000
        assert (await admin.post("/v1/admin/tenants", json=body)).status_code == 409
        updated = await admin.put(
            "/v1/admin/tenants/initech",
            json={"allowed_models": ["smol"], "share_prefix_cache": True},
        )
        assert (
            updated.json()["allowed_models"] == ["smol"] and updated.json()["priority_cap"] is None
        )
        key = await admin.post("/v1/admin/api_keys", json={"tenant": "initech", "roles": ["user"]})
        # the tenant's model list narrows its keys: the served model is not "smol"
        async with secured.client(key.json()["key"]) as user:
            assert (await user.post("/tokenize", json={"prompt": "x"})).status_code == 403
        got = (await admin.get("/v1/admin/tenants/initech")).json()
        assert got["num_active_keys"] == 1
        assert (await admin.delete("/v1/admin/tenants/initech")).status_code == 409
        await admin.delete(f"/v1/admin/api_keys/{key.json()['id']}")
        assert (await admin.delete("/v1/admin/tenants/initech")).status_code == 200
        assert (await admin.get("/v1/admin/tenants/initech")).status_code == 404
        assert (await admin.put("/v1/admin/tenants/initech", json={})).status_code == 404
        assert (await admin.post("/v1/admin/tenants", json={"name": "-bad"})).status_code == 400
        names = [t["name"] for t in (await admin.get("/v1/admin/tenants")).json()["data"]]
    assert "initech" not in names and {"acme", "globex"} <= set(names)
    assert "initech" not in {t.tenant for t in stored(secured).tenants}


async def test_rate_limits_and_guardrails_round_trip_and_persist(secured: SecuredApp):
    async with secured.client(KEYS["admin"]) as admin:
        update = {
            "default": {"requests_per_minute": 600},
            "tiers": {"gold": {"tokens_per_minute": 100000}, "free": {"max_concurrent": 1}},
            "tenants": {"globex": {"requests_per_minute": 60}},
        }
        put = await admin.put("/v1/admin/rate_limit", json=update)
        assert put.status_code == 200
        removed = await admin.put("/v1/admin/rate_limit", json={"tiers": {"free": None}})
        got = (await admin.get("/v1/admin/rate_limit")).json()
        assert removed.json() == got
        assert got["default"]["requests_per_minute"] == 600
        assert list(got["tiers"]) == ["gold"]
        assert got["tenants"]["globex"]["requests_per_minute"] == 60
        unknown = await admin.put("/v1/admin/rate_limit", json={"tenants": {"nobody": {}}})
        assert unknown.status_code == 404
        guardrails = {
            "blocklist": ["secret"],
            "blocklist_regex": [r"\bpwd\d+"],
            "pii_action": "redact",
        }
        assert (await admin.put("/v1/admin/guardrails", json=guardrails)).status_code == 200
        shown = (await admin.get("/v1/admin/guardrails")).json()
        bad_regex = await admin.put("/v1/admin/guardrails", json={"blocklist_regex": ["ok", "("]})
        bad_url = await admin.put("/v1/admin/guardrails", json={"opa_endpoint": "file:///x"})
    expected = {**guardrails, "opa_endpoint": None, "opa_fail_open": False}
    assert shown == {**expected, "invalid_blocklist_regex": []}
    assert bad_regex.status_code == 422 and "blocklist_regex[1]" in bad_regex.text
    assert bad_url.status_code == 400
    policy = stored(secured)
    assert policy.default_limits.requests_per_minute == 600
    assert policy.guardrails.blocklist == ("secret",) and policy.guardrails.pii_action == "redact"
    assert dict(policy.tiers)["gold"].tokens_per_minute == 100000
