"""LM Studio's REST API v0 (`/api/v0/*`) on a real server (SmolLM2), with httpx and the
openai SDK pointed at `/api/v0`: model objects, chat and text completions with LM
Studio's `stats`/`model_info`/`runtime`, streams, embeddings, and OpenAI-shaped errors
although the paths start with `/api/`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

STOP_REASONS = {"eosFound", "stopStringFound", "maxPredictedTokensReached"}
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120) as client:
        yield client


def _assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error, dict) and error["code"] == code, response.text


def test_models_list_and_retrieve(http: httpx.Client, served_model: str) -> None:
    listed = http.get("/api/v0/models")
    assert listed.status_code == 200
    body = listed.json()
    assert body["object"] == "list"
    model = next(m for m in body["data"] if m["id"] == served_model)
    assert model == {
        "id": served_model,
        "object": "model",
        "type": "llm",
        "publisher": model["publisher"],
        "arch": "llama",
        "compatibility_type": "gguf",
        "quantization": "Q4_1",
        "state": "loaded",
        "max_context_length": 8192,
    }
    assert isinstance(model["publisher"], str) and model["publisher"]
    assert http.get(f"/api/v0/models/{served_model}").json() == model
    _assert_openai_error(http.get("/api/v0/models/llama3"), 404, "model_not_found")


def test_chat_completion_has_stats(http: httpx.Client, served_model: str) -> None:
    body = {"model": served_model, "messages": CHAT, "max_tokens": 24, "temperature": 0}
    response = http.post("/api/v0/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["model"] == served_model
    assert answer["choices"][0]["message"]["content"]
    usage, stats = answer["usage"], answer["stats"]
    assert usage["completion_tokens"] > 0
    assert stats["stop_reason"] in STOP_REASONS
    assert stats["time_to_first_token"] > 0 and stats["generation_time"] >= 0
    if stats["generation_time"] > 0:
        expected = usage["completion_tokens"] / stats["generation_time"]
        assert stats["tokens_per_second"] == pytest.approx(expected, rel=0.05)
    assert answer["model_info"] == {
        "arch": "llama",
        "quant": "Q4_1",
        "format": "gguf",
        "context_length": answer["model_info"]["context_length"],
    }
    assert answer["model_info"]["context_length"] >= 512
    assert answer["runtime"]["supported_formats"] == ["gguf"]
    limited = http.post("/api/v0/chat/completions", json={**body, "max_tokens": 2}).json()
    assert limited["stats"]["stop_reason"] == "maxPredictedTokensReached"
    assert limited["usage"]["completion_tokens"] == 2


def test_text_completion_and_stream(http: httpx.Client, served_model: str) -> None:
    body = {"model": served_model, "prompt": "The capital of France is", "max_tokens": 4}
    answer = http.post("/api/v0/completions", json=body).json()
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"]
    assert answer["stats"]["stop_reason"] in STOP_REASONS
    assert answer["model_info"]["arch"] == "llama"
    chunks = []
    with http.stream("POST", "/api/v0/completions", json={**body, "stream": True}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks)


def test_openai_sdk_on_the_v0_base_url(server_url: str, served_model: str) -> None:
    with openai.OpenAI(base_url=f"{server_url}/api/v0", api_key="unused") as client:
        reply = client.chat.completions.create(
            model=served_model, messages=CHAT, max_tokens=8, temperature=0
        )
        assert reply.choices[0].message.content
        assert reply.model_extra is not None and "stats" in reply.model_extra
        text = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model=served_model, messages=CHAT, max_tokens=8, stream=True
            )
            if chunk.choices
        )
        assert text
        vectors = client.embeddings.create(model=served_model, input=["red", "blue"])
        assert len(vectors.data) == 2 and len(vectors.data[0].embedding) > 0


def test_errors_are_openai_shaped(http: httpx.Client, served_model: str) -> None:
    missing = http.post("/api/v0/chat/completions", json={"model": "llama3", "messages": CHAT})
    _assert_openai_error(missing, 404, "model_not_found")
    bad = http.post("/api/v0/chat/completions", json={"model": served_model, "messages": "hi"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
    broken = http.post(
        "/api/v0/completions", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert broken.status_code == 400 and isinstance(broken.json()["error"], dict)
    empty = http.post("/api/v0/embeddings", json={"model": served_model, "input": []})
    assert empty.status_code == 400 and isinstance(empty.json()["error"], dict)
    unknown = http.get("/api/v0/nothing-here")
    assert unknown.status_code == 404 and isinstance(unknown.json()["error"], dict)
    # Ollama's routes keep Ollama's shape
    ollama_missing = http.post("/api/show", json={"model": "llama3"})
    assert ollama_missing.status_code == 404 and ollama_missing.json() == {
        "error": "model 'llama3' not found"
    }
