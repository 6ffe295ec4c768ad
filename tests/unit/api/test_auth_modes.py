"""Authentication off by default (everyone is the anonymous admin), on from the first key:
a key created through the admin API of an open server closes it, and revoking the last
key never reopens it. Over the fake engine (the logic under test is the app's)."""

from __future__ import annotations

import httpx

from inferflux.api import create_app
from inferflux.api.state import app_state
from inferflux.config.settings import Settings
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info


def client_for(app, key: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers)


async def test_no_auth_configured_means_anonymous_with_every_scope():
    app = create_app(
        Settings(),
        engine=FakeEngineClient(),
        tokenizer=FakeTokenizer(),
        model_info=fake_model_info(),
    )
    async with app.router.lifespan_context(app), client_for(app) as client:
        assert not app_state(app).security.authenticator.enabled
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/debug/requests")).status_code == 200
        # credentials are not checked at all while auth is off
        assert (await client.get("/v1/models", headers={"x-api-key": "junk"})).status_code == 200
        created = await client.post("/v1/admin/api_keys", json={"roles": ["admin"]})
        assert created.status_code == 201
        key, key_id = created.json()["key"], created.json()["id"]
        assert app_state(app).security.authenticator.enabled
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/healthz")).status_code == 200
        async with client_for(app, key) as admin:
            assert (await admin.get("/v1/models")).status_code == 200
            assert (await admin.delete(f"/v1/admin/api_keys/{key_id}")).status_code == 200
            assert (await admin.get("/v1/models")).status_code == 401
        # the last key is revoked, and the server stays closed
        assert (await client.get("/v1/models")).status_code == 401
        assert (
            await client.post("/v1/admin/api_keys", json={"roles": ["admin"]})
        ).status_code == 401


async def test_a_configured_oidc_issuer_alone_turns_auth_on():
    settings = Settings.model_validate(
        {
            "auth": {
                "oidc": {
                    "issuer": "https://issuer.test",
                    "audience": "x",
                    "jwks_url": "https://127.0.0.1:1/jwks.json",
                }
            }
        }
    )
    app = create_app(
        settings, engine=FakeEngineClient(), tokenizer=FakeTokenizer(), model_info=fake_model_info()
    )
    async with app.router.lifespan_context(app), client_for(app) as client:
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/readyz")).status_code == 200
