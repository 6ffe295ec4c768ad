"""Embeddings end to end: the `openai` SDK and httpx against a real `inferflux serve` (SmolLM2),
the engine client in-process, and a worker killed mid-request.

Vectors come from llama.cpp (mean pooling over SmolLM2's hidden states, L2-normalized).
Batching changes kernels slightly (docs/engine-notes.md), so batched vs alone uses tolerances.
The worker-kill test starts a server of its own (killing the shared one's worker would
race other tests).
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
from fastapi import FastAPI
from openai import OpenAI

from inferflux.api.state import app_state
from inferflux.config.loader import load_settings
from inferflux.engine.messages import AddRequest, FinishReason, SamplingParams
from inferflux.engine.protocol import EngineClient, Tokenizer
from inferflux.models.files import load_served_model
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

N_EMBD = 576  # SmolLM2-135M's embedding_length
CAT = "The cat sat on the mat."
CAT_PARAPHRASE = "A cat was sitting on the rug."
REVENUE = "Quarterly revenue grew by twelve percent."
OTHERS = [
    "Photosynthesis turns light into chemical energy.",
    "The train leaves at seven in the morning.",
    "def add(a, b):\n    return a + b",
    "Paris is the capital of France.",
    "She plays the violin every evening.",
    "Water boils at one hundred degrees Celsius.",
    "The stock market closed higher today.",
]


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """The served model's vocabulary, loaded in the test process (no weights)."""
    return load_served_model(load_settings(env={}))[1]


def vectors_of(client: OpenAI, inputs: list[str] | list[int]) -> np.ndarray:
    response = client.embeddings.create(model="SmolLM2-135M-Instruct.Q4_1", input=inputs)
    return np.array([item.embedding for item in response.data], dtype=np.float64)


def test_vectors_have_the_model_width_and_unit_norm(client: OpenAI) -> None:
    response = client.embeddings.create(model="SmolLM2-135M-Instruct.Q4_1", input=[CAT, REVENUE])
    assert [item.index for item in response.data] == [0, 1]
    vectors = np.array([item.embedding for item in response.data])
    assert vectors.shape == (2, N_EMBD)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert response.usage.prompt_tokens == response.usage.total_tokens > 10
    assert response.model == "SmolLM2-135M-Instruct.Q4_1"


def test_a_paraphrase_is_closer_than_an_unrelated_text(client: OpenAI) -> None:
    cat, paraphrase, revenue = vectors_of(client, [CAT, CAT_PARAPHRASE, REVENUE])
    assert float(cat @ paraphrase) > float(cat @ revenue) + 0.1


def test_a_text_embeds_the_same_alone_and_in_a_batch(client: OpenAI) -> None:
    # NOTE: measured: cos 1.0 (to 7 digits) up to 64 tokens per forward pass; above that
    # ggml's CPU matmul takes another path (cos 0.99946 for this batch of 65 tokens).
    (alone,) = vectors_of(client, [CAT])
    batched = vectors_of(client, [*OTHERS, CAT])
    assert float(alone @ batched[-1]) > 0.999
    np.testing.assert_allclose(batched[-1], alone, atol=1e-2)
    (again,) = vectors_of(client, [CAT])
    np.testing.assert_array_equal(again, alone)  # same batch shape: same kernels


def test_base64_decodes_to_the_same_floats(http: httpx.Client) -> None:
    body = {"input": [CAT, REVENUE]}
    floats = http.post("/v1/embeddings", json=body).json()["data"]
    packed = http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    for plain, encoded in zip(floats, packed["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(encoded["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(plain["embedding"], dtype=np.float32))


def test_token_ids_embed_like_the_text_they_encode(client: OpenAI, tokenizer: Tokenizer) -> None:
    token_ids = tokenizer.tokenize(CAT, add_special=True, parse_special=True)
    (from_text,) = vectors_of(client, [CAT])
    (from_ids,) = vectors_of(client, token_ids)
    np.testing.assert_allclose(from_ids, from_text, atol=1e-6)
    response = client.embeddings.create(model="SmolLM2-135M-Instruct.Q4_1", input=[token_ids])
    assert response.usage.prompt_tokens == len(token_ids)


def test_an_input_longer_than_one_forward_pass_is_embedded_whole(
    http: httpx.Client, tokenizer: Tokenizer
) -> None:
    text = " ".join(OTHERS * 30)
    num_tokens = len(tokenizer.tokenize(text, add_special=True, parse_special=True))
    assert num_tokens > 1024  # spans several 512-token passes
    response = http.post("/v1/embeddings", json={"input": [text, CAT]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["prompt_tokens"] == num_tokens + len(
        tokenizer.tokenize(CAT, add_special=True, parse_special=True)
    )
    vector = np.array(body["data"][0]["embedding"])
    assert vector.shape == (N_EMBD,) and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


def test_dimensions_must_be_the_model_width(client: OpenAI) -> None:
    response = client.embeddings.create(
        model="SmolLM2-135M-Instruct.Q4_1", input=CAT, dimensions=N_EMBD
    )
    assert len(response.data[0].embedding) == N_EMBD
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="SmolLM2-135M-Instruct.Q4_1", input=CAT, dimensions=64)
    assert caught.value.body["param"] == "dimensions"


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"input": ""}, 400, "input", "invalid_request"),
        ({"input": []}, 400, "input", "invalid_request"),
        ({"input": [CAT, ""]}, 400, "input[1]", "invalid_request"),
        ({"input": 42}, 400, "input", "invalid_request"),
        ({"input": [CAT, 7]}, 400, "input[1]", "invalid_request"),
        ({"input": [10**9]}, 400, "input", "invalid_request"),
        ({"input": "hello " * 5000}, 400, "input", "context_length_exceeded"),
        ({"input": CAT, "model": "gpt-4o"}, 404, "model", "model_not_found"),
        ({"input": ["a"] * 2049}, 400, "input", "invalid_request"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(
    http: httpx.Client, body: dict, status: int, param: str, code: str
) -> None:
    response = http.post("/v1/embeddings", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        param,
        code,
        "invalid_request_error",
    )
    assert error["message"]


def test_the_sdk_raises_on_an_unknown_model(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input=CAT)


def test_native_embeddings_match_the_openai_route(http: httpx.Client) -> None:
    native = http.post("/embeddings", json={"input": [CAT, REVENUE]})
    assert native.status_code == 200, native.text
    body = native.json()
    assert body["object"] == "list" and body["model"] == "SmolLM2-135M-Instruct.Q4_1"
    openai_body = http.post("/v1/embeddings", json={"input": [CAT, REVENUE]}).json()
    assert body["usage"] == openai_body["usage"]
    for mine, theirs in zip(body["data"], openai_body["data"], strict=True):
        np.testing.assert_array_equal(mine["embedding"], theirs["embedding"])
    bad = http.post("/embeddings", json={"input": [1, 2, 3]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0]"


def test_embeddings_are_answered_while_a_generation_streams(http: httpx.Client) -> None:
    """An embedding request runs between the steps of a running generation (worker process)."""
    chat = {
        "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
        "max_tokens": 200,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with http.stream("POST", "/v1/chat/completions", json=chat) as stream:
        lines = stream.iter_lines()
        assert any(line.startswith("data: {") for line in lines)  # generating now
        embedded = http.post("/v1/embeddings", json={"input": [CAT, REVENUE]})
        assert embedded.status_code == 200
        assert len(embedded.json()["data"]) == 2
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert any('"finish_reason":"length"' in line for line in rest)


async def test_engine_client_interleaves_embeddings_with_running_generations(
    inprocess_app: FastAPI, tokenizer: Tokenizer
) -> None:
    """EngineClient.embed while generations run: everything completes, and the embeddings
    finish before the generations (they do not wait for the batch to drain)."""
    # The engine client itself: the wrappers around it need a request's context.
    served = app_state(inprocess_app).models.default_serving().engine
    engine: EngineClient = served.inner.inner.client  # Guarded → Observed → ClientEngine
    prompt = tokenizer.tokenize("Once upon a time", add_special=True, parse_special=True)
    sampling = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    finished_at: list[float] = []

    async def generate(index: int) -> int:
        request = AddRequest(
            request_id=f"gen-embed-{index}", prompt_token_ids=prompt, sampling=sampling
        )
        async for delta in engine.generate(request):
            if delta.finish_reason is not None:
                finished_at.append(time.monotonic())
                assert delta.finish_reason is FinishReason.LENGTH
                return delta.num_output_tokens
        raise AssertionError("the generation ended without a finish_reason")

    generations = [asyncio.create_task(generate(i)) for i in range(3)]
    await asyncio.sleep(0.3)
    texts = [CAT, REVENUE, *OTHERS]
    token_lists = [tokenizer.tokenize(t, add_special=True, parse_special=True) for t in texts]
    results = await asyncio.gather(*(engine.embed([ids]) for ids in token_lists))
    embedded_at = time.monotonic()
    assert await asyncio.gather(*generations) == [64, 64, 64]
    assert embedded_at < min(finished_at)
    for result, ids in zip(results, token_lists, strict=True):
        (vector,) = result.vectors
        assert len(vector) == N_EMBD and result.num_prompt_tokens == len(ids)
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    raw = await engine.embed(token_lists[:1], normalize=False)
    assert float(np.linalg.norm(raw.vectors[0])) > 1.5  # the unnormalized mean


def test_a_worker_killed_mid_embedding_is_replaced_and_the_request_resubmitted(
    tmp_path,
) -> None:
    server = ServerProcess(log_path=tmp_path / "server.log")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            pid = http.get("/server/stats").json()["workers"][0]["pid"]
            answers: list[httpx.Response] = []
            body = {"input": [" ".join(OTHERS * 12)] * 4}  # ≈2,000 tokens: seconds of work
            worker = threading.Thread(
                target=lambda: answers.append(http.post("/v1/embeddings", json=body))
            )
            worker.start()
            deadline = time.monotonic() + 30
            while http.get("/server/stats").json()["workers"][0]["num_in_flight"] == 0:
                assert time.monotonic() < deadline, "the embedding never reached the worker"
                time.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
            worker.join(120)
            (answer,) = answers
            assert answer.status_code == 200, answer.text
            assert len(answer.json()["data"]) == 4
            status = http.get("/server/stats").json()["workers"][0]
            assert status["restarts"] == 1 and status["pid"] != pid
    finally:
        server.close()
