"""/v1/admin/workers over the fake engine: the listing, a scale reaching the engine, and
every refusal with its status. Real scaling (workers started and drained) is in
tests/integration/test_worker_scaling.py."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.engine import FakeEngineClient
from tests.openai_envelope import assert_envelope

URL = "/v1/admin/workers"


async def test_list_shows_the_default_models_workers(client: httpx.AsyncClient) -> None:
    body = (await client.get(URL)).json()
    (model,) = body["data"]
    assert model["model"] == "fake-model" and model["default"] is True
    assert model["num_workers"] == 1 and model["num_draining"] == 0
    (worker,) = model["workers"]
    assert worker["pid"] == 4242 and worker["hangs"] == 0 and worker["draining"] is False
    assert (await client.get(URL, params={"model": "fake-model"})).json() == body


async def test_post_scales_the_named_or_default_model(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    assert (await client.post(URL, json={"workers": 3})).status_code == 200
    reply = await client.post(URL, json={"model": "fake-model", "workers": 1})
    assert reply.status_code == 200 and reply.json()["model"] == "fake-model"
    assert engine.scaled == [3, 1]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"workers": 0}, 400, "invalid_request", "workers"),
        ({"workers": 65}, 400, "invalid_request", "workers"),
        ({"workers": "x"}, 400, "invalid_request", "workers"),
        ({"workers": 2.5}, 400, "invalid_request", "workers"),
        ({}, 400, "invalid_request", "workers"),
        ({"workers": 2, "replicas": 1}, 400, "invalid_request", "replicas"),
        ({"model": "nope", "workers": 2}, 404, "model_not_found", "model"),
    ],
)
async def test_refusals(
    client: httpx.AsyncClient, engine: FakeEngineClient, body, status, code, param
) -> None:
    response = await client.post(URL, json=body)
    assert_envelope(response, status, code=code)
    assert response.json()["error"]["param"] == param
    assert engine.scaled == []


async def test_an_unknown_model_in_the_listing_is_a_404(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.get(URL, params={"model": "nope"}), 404, code="model_not_found")
