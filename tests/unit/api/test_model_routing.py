"""Routes resolve the request's `model` through the model router: aliases, unknown models in
each API's error shape, the MoE request counter."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest

from inferflux.api import create_app
from inferflux.config.settings import Settings
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
