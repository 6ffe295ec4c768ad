"""POST /v1/embeddings and POST /embeddings over the fake engine: input parsing, checks, shapes.

The vectors here are the fake engine's; real ones are tested in
tests/integration/test_embeddings.py.
"""

from __future__ import annotations

import base64
import struct

import pytest

from inferflux.api.openai.embeddings import MAX_INPUTS
from inferflux.config.settings import Settings
from inferflux.errors import NoWorkerReady
from tests.fakes.engine import FAKE_BOS, FAKE_N_EMBD


@pytest.fixture
def settings() -> Settings:
    return Settings.model_validate({"server": {"max_request_bytes": 1 << 20}})


def ids(text: str) -> list[int]:
    """What FakeTokenizer makes of `text` with special tokens added."""
    return [FAKE_BOS] + [b + 3 for b in text.encode()]


async def test_a_string_is_tokenized_and_answered_in_openai_shape(client, engine) -> None:
    response = await client.post("/v1/embeddings", json={"input": "hi", "model": "fake-model"})
    assert response.status_code == 200
    assert engine.embedded == [[ids("hi")]]
    body = response.json()
    assert body["object"] == "list" and body["model"] == "fake-model"
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    (item,) = body["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    assert len(item["embedding"]) == FAKE_N_EMBD
    assert sum(x * x for x in item["embedding"]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (["a", "bc"], [ids("a"), ids("bc")]),
        ([7, 8, 9], [[7, 8, 9]]),
        ([[7], [8, 9]], [[7], [8, 9]]),
    ],
)
async def test_every_input_form_reaches_the_engine_as_token_lists(
    client, engine, value, expected
) -> None:
    response = await client.post("/v1/embeddings", json={"input": value, "user": "u1"})
    assert response.status_code == 200
    assert engine.embedded == [expected]
    body = response.json()
    assert [d["index"] for d in body["data"]] == list(range(len(expected)))
    assert body["usage"]["prompt_tokens"] == sum(len(t) for t in expected)


async def test_base64_is_little_endian_float32_of_the_same_vectors(client) -> None:
    floats = await client.post("/v1/embeddings", json={"input": ["ab", "c"]})
    packed = await client.post(
        "/v1/embeddings", json={"input": ["ab", "c"], "encoding_format": "base64"}
    )
    assert packed.status_code == 200
    for plain, encoded in zip(floats.json()["data"], packed.json()["data"], strict=True):
        raw = base64.b64decode(encoded["embedding"])
        decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
        assert decoded == pytest.approx(plain["embedding"], rel=1e-6)


async def test_dimensions_equal_to_the_model_size_is_accepted(client) -> None:
    response = await client.post("/v1/embeddings", json={"input": "a", "dimensions": FAKE_N_EMBD})
    assert response.status_code == 200


def assert_error(response, status: int, param: str | None, code: str = "invalid_request") -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert error["type"] == "invalid_request_error"
    return str(error["message"])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": []}, "input"),
        ({"input": [[1], []]}, "input[1]"),
        ({"input": 5}, "input"),
        ({"input": None}, "input"),
        ({"input": [1.5]}, "input[0]"),
        ({"input": ["a", 1]}, "input[1]"),
        ({"input": {"text": "a"}}, "input"),
        ({}, "input"),
        ({"input": "a", "encoding_format": "binary"}, "encoding_format"),
        ({"input": "a", "dimensions": 2}, "dimensions"),
        ({"input": "a", "dimensions": "4"}, "dimensions"),
        ({"input": "a", "frobnicate": 1}, "frobnicate"),
        ({"input": [300]}, "input"),
        ({"input": [[1], [-1]]}, "input[1]"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(client, engine, body, param) -> None:
    assert_error(await client.post("/v1/embeddings", json=body), 400, param)
    assert engine.embedded == []


async def test_too_many_inputs_is_a_400(client, engine) -> None:
    response = await client.post("/v1/embeddings", json={"input": ["a"] * (MAX_INPUTS + 1)})
    message = assert_error(response, 400, "input")
    assert str(MAX_INPUTS) in message
    assert (await client.post("/v1/embeddings", json={"input": ["a"] * MAX_INPUTS})).is_success


async def test_an_input_longer_than_the_context_is_context_length_exceeded(client) -> None:
    response = await client.post("/v1/embeddings", json={"input": ["ok", "x" * 300]})
    message = assert_error(response, 400, "input[1]", "context_length_exceeded")
    assert "256" in message and "301" in message


async def test_an_unknown_model_is_a_404(client) -> None:
    response = await client.post("/v1/embeddings", json={"input": "a", "model": "gpt-x"})
    assert_error(response, 404, "model", "model_not_found")


async def test_no_ready_worker_is_a_503(client, engine) -> None:
    engine.raise_on_submit = NoWorkerReady("no engine worker is ready; retry shortly")
    response = await client.post("/v1/embeddings", json={"input": "a"})
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_worker_ready"


async def test_native_embeddings_answers_the_spec_shape(client, engine) -> None:
    response = await client.post("/embeddings", json={"input": ["a", "bc"]})
    assert response.status_code == 200
    assert engine.embedded == [[ids("a"), ids("bc")]]
    body = response.json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert [(d["object"], d["index"], len(d["embedding"])) for d in body["data"]] == [
        ("embedding", 0, FAKE_N_EMBD),
        ("embedding", 1, FAKE_N_EMBD),
    ]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}


@pytest.mark.parametrize(
    ("body", "param"),
    [({"input": ""}, "input"), ({"input": [1, 2]}, "input[0]"), ({"text": "a"}, "input")],
)
async def test_native_embeddings_takes_text_only(client, body, param) -> None:
    response = await client.post("/embeddings", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
