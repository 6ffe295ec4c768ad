"""The native routes (/generate, /chat) over the fake engine: shapes, SSE events, finish
reasons, priority, errors and disconnects. Real generation is in tests/integration."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
from fastapi import FastAPI

from inferflux.api.native.protocol import (
    NativeChatResponse,
    NativeGenerateResponse,
    NativeStreamEvent,
)
from inferflux.engine.messages import FinishReason, Priority
from inferflux.errors import NoWorkerReady
from tests.fakes.engine import FakeEngineClient
from tests.openai_envelope import assert_envelope
from tests.unit.api.test_disconnect import Client, wait_for

USER = [{"role": "user", "content": "hi"}]


def native_events(response: httpx.Response) -> list[dict[str, object]]:
    """The JSON payloads of a native SSE body (no `[DONE]` sentinel)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = response.text.split("\n\n")
    assert chunks[-1] == ""
    payloads = []
    for chunk in chunks[:-1]:
        assert chunk.startswith("data: "), chunk
        payloads.append(json.loads(chunk.removeprefix("data: ")))
    return payloads


async def test_generate_response(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    response = await client.post("/generate", json={"prompt": "Once", "max_tokens": 10})
    assert response.status_code == 200
    body = NativeGenerateResponse.model_validate_json(response.content)
    add = engine.requests[0]
    assert body.request_id == add.request_id and body.request_id.startswith("gen-")
    assert body.object == "generation" and body.model == "fake-model"
    assert body.text == "Hello, world!" and body.finish_reason == "stop"
    assert body.usage.prompt_tokens == len(add.prompt_token_ids) == 5  # BOS + 4 bytes
    assert body.usage.completion_tokens == 4 and body.usage.total_tokens == 9
    assert body.usage.cached_tokens == 0
    assert body.timings.ttft_s is not None and 0 <= body.timings.ttft_s <= body.timings.total_s


async def test_generate_maps_knobs_to_the_engine(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {
        "prompt": "x",
        "max_tokens": 3,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 7,
        "stop_sequences": ["\n", "END"],
        "seed": 11,
        "priority": "high",
    }
    assert (await client.post("/generate", json=body)).status_code == 200
    add = engine.requests[0]
    assert add.priority is Priority.HIGH
    sampling = add.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p) == (3, 0.0, 0.5)
    assert (sampling.top_k, sampling.seed, sampling.stop) == (7, 11, ["\n", "END"])


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        (FinishReason.STOP_SEQUENCE, "stop_sequence"),
        (FinishReason.LENGTH, "length"),
        (FinishReason.ABORT, "abort"),
    ],
)
async def test_finish_reasons_keep_engine_names(
    client: httpx.AsyncClient, engine: FakeEngineClient, finish: FinishReason, expected: str
) -> None:
    engine.finish = finish
    response = await client.post("/generate", json={"prompt": "x"})
    assert response.json()["finish_reason"] == expected


async def test_max_tokens_cut_is_length(client: httpx.AsyncClient) -> None:
    response = await client.post("/generate", json={"prompt": "x", "max_tokens": 2})
    assert response.json()["finish_reason"] == "length"
    assert response.json()["text"] == "Hello,"


async def test_chat_response(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    messages = [{"role": "system", "content": "be brief"}, *USER]
    response = await client.post("/chat", json={"messages": messages, "priority": "low"})
    assert response.status_code == 200
    body = NativeChatResponse.model_validate_json(response.content)
    assert body.object == "chat" and body.request_id.startswith("chat-")
    assert body.message.role == "assistant" and body.message.content == "Hello, world!"
    assert engine.requests[0].priority is Priority.LOW
    prompt = bytes(t - 3 for t in engine.requests[0].prompt_token_ids if t >= 3).decode()
    assert "<|im_start|>system\nbe brief<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


async def test_generate_stream_events(client: httpx.AsyncClient) -> None:
    response = await client.post("/generate", json={"prompt": "x", "stream": True})
    assert response.status_code == 200
    events = [NativeStreamEvent.model_validate(e) for e in native_events(response)]
    assert [e.token for e in events] == ["Hello", ",", " world", "!", ""]
    assert [e.index for e in events] == [0, 1, 2, 3, 4]
    assert [e.finish_reason for e in events] == [None, None, None, None, "stop"]
    assert len({e.request_id for e in events}) == 1
    assert all(e.usage is None and e.timings is None for e in events[:-1])
    last = events[-1]
    assert last.usage is not None and last.usage.completion_tokens == 4
    assert last.timings is not None and last.timings.ttft_s is not None


async def test_chat_stream_engine_error_is_an_error_event(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.finish, engine.error = FinishReason.ERROR, "boom"
    response = await client.post("/chat", json={"messages": USER, "stream": True})
    events = native_events(response)
    assert [e["token"] for e in events[:-1]] == ["Hello", ",", " world", "!"]
    assert events[-1]["error"]["code"] == "engine_error"  # type: ignore[index]
    assert "boom" in events[-1]["error"]["message"]  # type: ignore[index]


async def test_engine_error_non_streaming_is_500(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.finish, engine.error = FinishReason.ERROR, "boom"
    assert_envelope(await client.post("/generate", json={"prompt": "x"}), 500, code="engine_error")


async def test_queue_timeout_is_408(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    engine.pieces, engine.finish = [], FinishReason.TIMEOUT
    response = await client.post("/chat", json={"messages": USER})
    assert_envelope(response, 408, code="queue_timeout")


async def test_no_worker_is_503(client: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    engine.raise_on_submit = NoWorkerReady("none")
    response = await client.post("/generate", json={"prompt": "x"})
    assert_envelope(response, 503, code="no_worker_ready")
    assert response.headers["retry-after"] == "1"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", {}, "prompt"),
        ("/generate", {"prompt": ""}, "prompt"),
        ("/generate", {"prompt": 5}, "prompt"),
        ("/generate", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/generate", {"prompt": "x", "temperature": "hot"}, "temperature"),
        ("/generate", {"prompt": "x", "top_p": 0}, "top_p"),
        ("/generate", {"prompt": "x", "top_k": 2**31}, "top_k"),
        ("/generate", {"prompt": "x", "stop_sequences": ["a"] * 17}, "stop_sequences"),
        ("/generate", {"prompt": "x", "stop_sequences": [""]}, "stop_sequences[0]"),
        ("/generate", {"prompt": "x", "stop_sequences": ["a" * 513]}, "stop_sequences[0]"),
        ("/generate", {"prompt": "x", "seed": 2**64}, "seed"),
        ("/generate", {"prompt": "x", "priority": "urgent"}, "priority"),
        ("/generate", {"prompt": "x", "stream": "yes"}, "stream"),
        ("/generate", {"prompt": "x", "stop": ["a"]}, "stop"),
        ("/chat", {}, "messages"),
        ("/chat", {"messages": []}, "messages"),
        ("/chat", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ("/chat", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ],
)
async def test_invalid_bodies_are_400_naming_the_field(
    client: httpx.AsyncClient, path: str, body: dict[str, object], param: str
) -> None:
    assert_envelope(await client.post(path, json=body), 400, param=param)


async def test_prompt_over_the_context_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/generate", json={"prompt": "x" * 300})  # n_ctx 256
    assert_envelope(response, 400, param="prompt", code="context_length_exceeded")


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/chat", json={"messages": USER, "model": "nope"})
    assert_envelope(response, 404, param="model", code="model_not_found")


@pytest.mark.parametrize("path", ["/generate", "/chat"])
async def test_disconnect_mid_stream_aborts(
    app: FastAPI, engine: FakeEngineClient, path: str
) -> None:
    engine.hang_after = 2
    body = {"prompt": "x"} if path == "/generate" else {"messages": USER}
    client = Client({**body, "stream": True})
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(app, client.scope(path), client.receive, client.send)
        await wait_for(lambda: len(client.messages) >= 3)  # start + 2 token events
        assert not engine.closed
        client.gone.set()
    assert engine.closed == [engine.requests[0].request_id]


async def test_disconnect_while_waiting_non_streaming_aborts(
    app: FastAPI, engine: FakeEngineClient
) -> None:
    engine.hang_after = 1
    client = Client({"prompt": "x"})
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(app, client.scope("/generate"), client.receive, client.send)
        await wait_for(lambda: bool(engine.requests))
        await anyio.sleep(0.05)
        client.gone.set()
    assert engine.closed == [engine.requests[0].request_id]
    assert client.messages[0]["status"] == 499
