"""/v1/admin/models over the fake engine: the listing, and every refusal with its status.

Real loads and swaps (files verified, workers started) are in tests/integration/test_hot_swap.py.
"""

from __future__ import annotations

import httpx
import pytest

from tests.openai_envelope import assert_envelope

SHA = "ab" * 32
URL = "/v1/admin/models"


async def test_list_shows_the_default_model_loaded(client: httpx.AsyncClient) -> None:
    body = (await client.get(URL)).json()
    (model,) = body["data"]
    assert model["id"] == "fake-model" and model["state"] == "loaded" and model["default"]
    assert model["source"] == "config" and model["workers"] == [{"pid": 4242, "ready": True}]
    assert model["num_in_flight"] == 0 and model["error"] is None


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"action": "fly", "id": "x"}, 400, "invalid_request", "action"),
        ({"action": "unload"}, 400, "invalid_request", "id"),
        ({"action": "unload", "id": "fake-model", "path": "x"}, 400, "invalid_request", "path"),
        ({"action": "swap", "id": "fake-model"}, 400, "invalid_request", "path"),
        ({"action": "load", "id": "m", "path": "m.gguf", "sha256": "12"}, 400, None, "sha256"),
        ({"action": "load", "id": "a b", "path": "m.gguf", "sha256": SHA}, 400, None, "id"),
        ({"action": "unload", "id": "fake-model"}, 409, "conflict", "id"),
        ({"action": "load", "id": "fake-model", "path": "m.gguf", "sha256": SHA}, 409, None, "id"),
        ({"action": "unload", "id": "nope"}, 404, "model_not_found", "model"),
        ({"action": "set_default", "id": "nope"}, 404, "model_not_found", "model"),
        ({"action": "swap", "id": "nope", "path": "m.gguf", "sha256": SHA}, 404, None, "id"),
        (
            {"action": "load", "id": "m", "path": "../../etc/passwd", "sha256": SHA},
            422,
            "model_verification_failed",
            "path",
        ),
        (
            {"action": "load", "id": "m", "path": "m.gguf", "sha256": SHA, "signature": "AAAA"},
            422,
            "model_verification_failed",
            "signature",
        ),
    ],
)
async def test_refusals(client: httpx.AsyncClient, body, status, code, param) -> None:
    response = await client.post(URL, json=body)
    assert_envelope(response, status, code=code)
    assert response.json()["error"]["param"] == param
    assert (await client.get(URL)).json()["data"][0]["state"] == "loaded"  # nothing changed


async def test_a_missing_file_is_a_404_and_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    body = {"action": "load", "id": "m", "path": "missing.gguf", "sha256": SHA}
    response = await client.post(URL, json=body)
    assert_envelope(response, 404, code="model_file_not_found")
    assert "does not exist" in response.json()["error"]["message"]
    models = {m["id"]: m for m in (await client.get(URL)).json()["data"]}
    assert set(models) == {"fake-model"}  # a failed admin load registers nothing
    assert (await client.get("/v1/models")).json()["data"][0]["id"] == "fake-model"
