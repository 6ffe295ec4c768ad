"""An app with authentication on, over the real engine (SmolLM2, in-process), for the
security tests: API keys for every scope (from the config file), a revoked key, a key
limited to another model, OIDC against a loopback HTTPS JWKS server, and an encrypted
policy store in a temp folder."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest
import trustme
import yaml
from fastapi import FastAPI

from inferflux.config.loader import load_settings
from tests.integration.inprocess_app import running_app
from tests.integration.security.jwks_server import AUDIENCE, ISSUER, JwksServer, SigningKey
from tests.integration.server_process import free_port

PASSPHRASE = "a test passphrase, long enough"
KEYS = {
    "admin": "sk-test-admin-0123456789",
    "read": "sk-test-read-0123456789",
    "generate": "sk-test-generate-0123456789",
    "adapter": "sk-test-adapter-0123456789",
    "other_model": "sk-test-other-model-0123456789",
    "globex": "sk-test-globex-0123456789",
}


@dataclass
class SecuredApp:
    app: FastAPI
    jwks: JwksServer
    rsa: SigningKey
    ec: SigningKey
    revoked_key: str
    store_path: str

    def client(self, key: str | None = None, **headers: str) -> httpx.AsyncClient:
        if key is not None:
            headers = {"authorization": f"Bearer {key}", **headers}
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://inferflux", headers=headers)


@pytest.fixture(scope="session")
def jwks(tmp_path_factory) -> Iterator[tuple[JwksServer, SigningKey, SigningKey]]:
    folder = tmp_path_factory.mktemp("jwks")
    server = JwksServer(trustme.CA(), folder / "ca.pem")
    rsa_key, ec_key = SigningKey("rsa-1", "RS256"), SigningKey("ec-1", "ES256")
    server.keys = [rsa_key.jwk, ec_key.jwk]
    yield server, rsa_key, ec_key
    server.close()


def config(jwks_server: JwksServer) -> dict:
    def key(secret: str, **values) -> dict:
        return {"key": secret, **values}

    return {
        "runtime": {"in_process": True},
        "server": {"grpc_port": free_port()},  # the gRPC frontend, for the controls table
        "auth": {
            "api_keys": [
                key(KEYS["admin"], id="admin", roles=["admin"], tenant="ops"),
                key(KEYS["read"], id="reader", scopes=["read"], tenant="acme"),
                key(KEYS["generate"], id="generator", scopes=["generate"], tenant="acme"),
                key(KEYS["adapter"], id="adapters", scopes=["adapter-manager"], tenant="acme"),
                key(KEYS["other_model"], id="other", roles=["user"], allowed_models=["other"]),
                key(KEYS["globex"], id="globex", roles=["user"], tenant="globex"),
            ],
            "tenants": [{"name": "acme", "requests_per_minute": 1000}, {"name": "globex"}],
            "oidc": {
                "issuer": ISSUER,
                "audience": AUDIENCE,
                "jwks_url": jwks_server.url,
                "jwks_ca_file": str(jwks_server.ca_path),
                "jwks_refetch_cooldown_s": 0,
            },
        },
    }


@pytest.fixture(scope="session")
async def secured(jwks, tmp_path_factory) -> AsyncIterator[SecuredApp]:
    server, rsa_key, ec_key = jwks
    folder = tmp_path_factory.mktemp("secured")
    config_path = folder / "inferflux.yaml"
    config_path.write_text(yaml.safe_dump(config(server)), encoding="utf-8")
    store_path = str(folder / "policy.store")
    env = {"INFERFLUX_POLICY_STORE": store_path, "INFERFLUX_POLICY_PASSPHRASE": PASSPHRASE}
    settings = load_settings(config_path, env=env)
    async with running_app(settings) as app:
        secured = SecuredApp(app, server, rsa_key, ec_key, "", store_path)
        secured.revoked_key = await _revoked_key(secured)
        yield secured


async def _revoked_key(secured: SecuredApp) -> str:
    async with secured.client(KEYS["admin"]) as client:
        created = await client.post("/v1/admin/api_keys", json={"scopes": ["read"]})
        assert created.status_code == 201, created.text
        body = created.json()
        assert (await client.delete(f"/v1/admin/api_keys/{body['id']}")).status_code == 200
        return str(body["key"])
