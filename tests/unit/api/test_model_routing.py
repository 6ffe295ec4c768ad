"""Routes resolve the request's `model` through the model router: aliases, unknown models in
each API's error shape, the MoE request counter."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest

from inferflux.api import create_app
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import SignatureVerifier
from inferflux.models.catalog import Catalog
from inferflux.models.spec import ModelSpec
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info
from tests.openai_envelope import assert_envelope

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
async def moe_client() -> AsyncIterator[httpx.AsyncClient]:
    info = dataclasses.replace(
        fake_model_info(), aliases=("fake-alias",), n_experts=8, n_active_experts=2
    )
    app = create_app(
        Settings(), engine=FakeEngineClient(), tokenizer=FakeTokenizer(), model_info=info
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.mark.parametrize("name", ["fake-model", "fake-alias", "fake-alias:latest", None])
async def test_ids_and_aliases_route_to_the_model(moe_client, name) -> None:
    body = {**CHAT, "model": name} if name else CHAT
    response = await moe_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "fake-model"  # answered with the canonical id


async def test_an_unknown_model_is_a_404_in_each_api_shape(moe_client) -> None:
    response = await moe_client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert_envelope(response, 404, param="model", code="model_not_found")
    assert "GET /v1/models" in response.json()["error"]["message"]
    response = await moe_client.post("/api/generate", json={"model": "nope", "prompt": "x"})
    assert response.status_code == 404 and response.json() == {"error": "model 'nope' not found"}


async def test_moe_models_are_described_and_counted(moe_client) -> None:
    (card,) = (await moe_client.get("/v1/models")).json()["data"]
    meta = card["meta"]
    assert (meta["is_moe"], meta["n_experts"], meta["n_active_experts"]) == (True, 8, 2)
    assert meta["aliases"] == ["fake-alias"]
    assert (await moe_client.get("/v1/models/fake-alias")).json()["id"] == "fake-model"
    for _ in range(2):
        await moe_client.post("/v1/chat/completions", json={**CHAT, "model": "fake-alias"})
    metrics = (await moe_client.get("/metrics")).text
    assert 'inferflux_moe_requests_total{model="fake-model"} 2.0' in metrics


async def test_allowed_models_are_checked_before_anything_loads(tmp_path) -> None:
    """A key allowed only the default model gets 403 for another registered model, and the
    server never tries to load it (its file does not even exist: a load would be a 404)."""
    key = "sk-test-only-fake-0123456789"
    settings = Settings.model_validate(
        {
            "auth": {
                "api_keys": [
                    {"key": key, "roles": ["user"], "allowed_models": ["fake-model"]},
                    {"key": "sk-test-admin-0123456789", "roles": ["admin"]},
                ]
            },
            "registry": {"max_resident_models": 1},  # no preload: only a request could load
        }
    )
    info = fake_model_info()
    default = ModelSpec(info.model_id, tmp_path / "fake.gguf", None, is_default=True)
    other = ModelSpec("other", tmp_path / "missing.gguf", "ab" * 32, source="manifest")
    plan = Catalog(
        default=default,
        models_dir=tmp_path,
        verifier=SignatureVerifier((), require=False),
        others=(other,),
    )
    app = create_app(
        settings, engine=FakeEngineClient(), tokenizer=FakeTokenizer(), model_info=info,
        catalog=plan,
    )  # fmt: skip
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers=headers
        ) as client:
            response = await client.post("/v1/chat/completions", json={**CHAT, "model": "other"})
            assert_envelope(response, 403, param="model", code="insufficient_scope")
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            ids = [c["id"] for c in (await client.get("/v1/models")).json()["data"]]
            assert ids == ["fake-model"]
            tags = (await client.get("/api/tags")).json()["models"]
            assert [t["name"] for t in tags] == []  # the fake file has no GGUF header
            shown = await client.post("/api/show", json={"model": "other"})
            assert shown.status_code in (403, 404)
        admin = {"authorization": "Bearer sk-test-admin-0123456789"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers=admin
        ) as client:
            states = {
                m["id"]: m["state"] for m in (await client.get("/v1/admin/models")).json()["data"]
            }
            assert states == {"fake-model": "loaded", "other": "registered"}  # never loaded
