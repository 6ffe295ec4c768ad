"""The OpenAI API over the real engine: shapes through httpx (in-process app, engine on a thread),
and client disconnects against a real uvicorn server.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from fastapi import FastAPI

from inferflux.api.state import app_state

pytestmark = pytest.mark.model

USER = [{"role": "user", "content": "Name three fruits."}]


def sse_payloads(text: str) -> list[object]:
    payloads: list[object] = []
    for event in text.split("\n\n"):
        if event:
            data = event.removeprefix("data: ")
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


async def test_models_describe_the_real_gguf(api_client: httpx.AsyncClient) -> None:
    (card,) = (await api_client.get("/v1/models")).json()["data"]
    assert card["id"] == "SmolLM2-135M-Instruct.Q4_1"
    meta = card["meta"]
    assert meta["architecture"] == "llama" and meta["n_vocab"] == 49152
    assert meta["n_ctx"] == 4096 and meta["n_ctx_train"] == 8192 and meta["size_bytes"] > 10**7


async def test_chat_completion(api_client: httpx.AsyncClient) -> None:
    body = {"messages": USER, "max_tokens": 12, "temperature": 0}
    response = await api_client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    data = response.json()
    assert data["object"] == "chat.completion" and data["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert data["choices"][0]["message"]["content"]
    usage = data["usage"]
    assert usage["prompt_tokens"] > 5 and 1 <= usage["completion_tokens"] <= 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_streamed_chat_equals_non_streamed(api_client: httpx.AsyncClient) -> None:
    body = {"messages": USER, "max_tokens": 12, "temperature": 0}
    expected = (await api_client.post("/v1/chat/completions", json=body)).json()
    response = await api_client.post(
        "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    *chunks, usage_chunk, done = sse_payloads(response.text)
    assert done == "[DONE]"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)  # type: ignore[index]
    assert text == expected["choices"][0]["message"]["content"]
    assert usage_chunk["usage"] == expected["usage"]  # type: ignore[index]
    assert chunks[-1]["choices"][0]["finish_reason"] == expected["choices"][0]["finish_reason"]  # type: ignore[index]


async def test_completion_with_token_ids(
    api_client: httpx.AsyncClient, inprocess_app: FastAPI
) -> None:
    tokenizer = app_state(inprocess_app).models.default_serving().tokenizer
    prompt_ids = tokenizer.tokenize(
        "The capital of France is", add_special=True, parse_special=True
    )
    body = {"prompt": prompt_ids, "max_tokens": 4, "temperature": 0}
    by_ids = (await api_client.post("/v1/completions", json=body)).json()
    by_text = (
        await api_client.post(
            "/v1/completions", json={**body, "prompt": "The capital of France is"}
        )
    ).json()
    assert by_ids["usage"]["prompt_tokens"] == len(prompt_ids)
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


async def test_context_length_uses_the_real_tokenizer(api_client: httpx.AsyncClient) -> None:
    body = {"prompt": "hello " * 5000, "max_tokens": 4}
    response = await api_client.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and "4096" in error["message"]


async def test_stats_count_engine_steps(api_client: httpx.AsyncClient) -> None:
    await api_client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    stats = (await api_client.get("/server/stats")).json()
    (worker,) = stats["workers"]
    assert worker["ready"] is True and worker["num_steps"] > 0
    assert worker["num_generated_tokens_total"] >= 2 and stats["num_in_flight"] == 0


async def test_health_probes(api_client: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/livez", "/readyz"):
        assert (await api_client.get(path)).status_code == 200


def _engine_state(client: httpx.Client) -> tuple[int, int, int]:
    stats = client.get("/server/stats").json()
    worker = stats["workers"][0]
    return stats["num_in_flight"], worker["num_running"], worker["num_generated_tokens_total"]


@pytest.mark.server
def test_disconnect_mid_stream_frees_the_engine(server_url: str) -> None:
    body = {
        "prompt": "Count from one to one thousand:",
        "max_tokens": 2000,
        "ignore_eos": True,  # never ends before the disconnect
        "stream": True,
    }
    with httpx.Client(base_url=server_url, timeout=60) as client:
        generated_before = _engine_state(client)[2]
        with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            num_events = 0
            for line in response.iter_lines():
                num_events += line.startswith("data: ")
                if num_events >= 3:
                    break
        # Leaving the block closed the connection mid-generation.
        deadline = time.monotonic() + 10
        state = _engine_state(client)
        while state[:2] != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
            state = _engine_state(client)
        assert state[:2] == (0, 0), state
        assert state[2] - generated_before < 1000
