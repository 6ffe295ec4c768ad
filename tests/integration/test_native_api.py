"""The native API (/generate, /chat) against a real `inferflux serve` with SmolLM2, over httpx:
JSON responses, SSE streams, finish reasons, priorities and client disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from inferflux.api.native.protocol import (
    NativeChatResponse,
    NativeGenerateResponse,
    NativeStreamEvent,
)

pytestmark = [pytest.mark.model, pytest.mark.server]

USER = [{"role": "user", "content": "Name three colors."}]
COUNTING = "Count from 1 to 1000: 1, 2, 3, 4, 5,"


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120) as client:
        yield client


def stream_events(
    client: httpx.Client, path: str, body: dict[str, object]
) -> list[NativeStreamEvent]:
    """Every event of a native stream, parsed by the response model."""
    events = []
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(NativeStreamEvent.model_validate_json(line.removeprefix("data: ")))
            else:
                assert line == "", line
    return events


def test_generate_returns_text_counts_and_timings(client: httpx.Client) -> None:
    body = {"prompt": COUNTING, "max_tokens": 8, "temperature": 0}
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    result = NativeGenerateResponse.model_validate_json(response.content)
    assert result.request_id.startswith("gen-") and result.object == "generation"
    assert result.model == client.get("/v1/models").json()["data"][0]["id"]
    assert result.text.strip() and result.finish_reason == "length"
    assert result.usage.completion_tokens == 8 and result.usage.prompt_tokens > 10
    assert result.usage.total_tokens == result.usage.prompt_tokens + 8
    assert result.timings.ttft_s is not None
    assert 0 < result.timings.ttft_s <= result.timings.total_s
    # the same body, greedy: the same text (requirement: deterministic at temperature 0)
    again = NativeGenerateResponse.model_validate_json(client.post("/generate", json=body).content)
    assert again.text == result.text and again.request_id != result.request_id


def test_chat_answers_as_the_assistant(client: httpx.Client) -> None:
    body = {"messages": USER, "max_tokens": 24, "temperature": 0, "priority": "high"}
    response = client.post("/chat", json=body)
    assert response.status_code == 200, response.text
    result = NativeChatResponse.model_validate_json(response.content)
    assert result.object == "chat" and result.request_id.startswith("chat-")
    assert result.message.role == "assistant" and result.message.content.strip()
    assert result.finish_reason in ("stop", "length")
    assert result.usage.completion_tokens >= 1


def test_stop_sequence_finish_reason_keeps_its_name(client: httpx.Client) -> None:
    body = {"prompt": COUNTING, "max_tokens": 32, "temperature": 0, "stop_sequences": [","]}
    result = client.post("/generate", json=body).json()
    assert result["finish_reason"] == "stop_sequence", result
    assert "," not in result["text"]


def test_generate_stream_events(client: httpx.Client) -> None:
    body = {"prompt": COUNTING, "max_tokens": 6, "temperature": 0, "priority": "low"}
    events = stream_events(client, "/generate", body)
    assert [event.index for event in events] == list(range(len(events)))
    assert all(event.finish_reason is None for event in events[:-1])
    assert all(event.usage is None for event in events[:-1])
    last = events[-1]
    assert last.finish_reason == "length" and last.usage is not None
    assert last.usage.completion_tokens == 6 and last.timings is not None
    assert len({event.request_id for event in events}) == 1
    streamed = "".join(event.token for event in events)
    whole = client.post("/generate", json=body).json()["text"]
    assert streamed == whole  # greedy: the stream spells the same text


def test_chat_stream_ends_with_a_finish_reason(client: httpx.Client) -> None:
    events = stream_events(client, "/chat", {"messages": USER, "max_tokens": 16, "seed": 3})
    assert events[-1].finish_reason in ("stop", "length")
    assert "".join(event.token for event in events).strip()


def in_flight(client: httpx.Client) -> int:
    return int(client.get("/server/stats").json()["num_in_flight"])


def test_client_disconnect_aborts_the_stream(client: httpx.Client, server_url: str) -> None:
    # greedy, SmolLM2 continues this list to the token limit (COUNTING stops at 76 tokens)
    body = {"prompt": "a, b, c, d, e, f, g, h,", "max_tokens": 2000, "temperature": 0}
    body["stream"] = True
    with (
        httpx.Client(base_url=server_url, timeout=60) as streaming,
        streaming.stream("POST", "/generate", json=body) as response,
    ):
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first.removeprefix("data: "))["index"] == 0
        assert in_flight(client) == 1
    # the connection is closed: the engine must stop long before 2000 tokens (~a minute)
    deadline = time.monotonic() + 10
    while in_flight(client) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert in_flight(client) == 0


def test_context_overflow_and_unknown_model(client: httpx.Client) -> None:
    response = client.post("/generate", json={"prompt": "word " * 5000, "max_tokens": 4})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    response = client.post("/chat", json={"messages": USER, "model": "gpt-17"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
