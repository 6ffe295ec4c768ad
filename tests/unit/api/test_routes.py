"""Chat and text completions over the fake engine: response shapes, SSE chunks, engine errors."""

from __future__ import annotations

import json

import httpx
import pytest

from inferflux.api.state import app_state
from inferflux.engine.messages import FinishReason
from inferflux.errors import EngineDeadError, NoWorkerReady
from tests.fakes.engine import FAKE_BOS, FakeEngineClient, FakeTokenizer
from tests.openai_envelope import assert_envelope

USER = [{"role": "user", "content": "hi"}]
COMMON_KEYS = {"id", "object", "created", "model", "system_fingerprint", "choices"}


def usage_dict(prompt: int, completion: int, cached: int = 0) -> dict[str, object]:
    """OpenAI's usage object, details included."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def sse_payloads(response: httpx.Response) -> list[object]:
    """The `data:` payloads of an SSE body, JSON-decoded except the final `[DONE]`."""
    assert response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert events[-1] == ""
    payloads: list[object] = []
    for event in events[:-1]:
        assert event.startswith("data: "), event
        data = event.removeprefix("data: ")
        payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


async def test_chat_non_streaming_shape(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": USER})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == COMMON_KEYS | {"usage"}
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-") and body["model"] == "fake-model"
    assert body["system_fingerprint"].startswith("fp_")
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello, world!", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    num_prompt = len(engine.requests[0].prompt_token_ids)
    assert body["usage"] == usage_dict(num_prompt, 4)
    assert engine.requests[0].request_id == body["id"]


async def test_chat_renders_template_and_tokenizes_with_bos(
    client: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: FakeTokenizer
) -> None:
    await client.post("/v1/chat/completions", json={"messages": USER})
    text, add_special, parse_special = tokenizer.calls[-1]
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert add_special and parse_special
    request = engine.requests[0]
    assert request.prompt_token_ids[0] == FAKE_BOS
    # max_tokens unset: whatever the context (256) leaves.
    assert request.sampling.max_tokens == 256 - len(request.prompt_token_ids)


async def test_template_that_starts_with_bos_is_not_given_a_second(
    app: object, client: httpx.AsyncClient, tokenizer: FakeTokenizer
) -> None:
    from inferflux.engine.chat_template import ChatTemplate

    serving = app_state(app).models.default_serving()
    template = ChatTemplate.from_model(
        "{{ bos_token }}{{ messages[0]['content'] }}", "x", "<s>", ""
    )
    object.__setattr__(serving, "chat_template", template)
    await client.post("/v1/chat/completions", json={"messages": USER})
    assert tokenizer.calls[-1] == ("<s>hi", False, True)


async def test_chat_sampling_reaches_the_engine(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"messages": USER, "max_tokens": 3, "temperature": 0, "seed": 5, "stop": ["x"]}
    response = await client.post("/v1/chat/completions", json=body)
    sampling = engine.requests[0].sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.seed) == (3, 0.0, 5)
    assert sampling.stop == ["x"]
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == "Hello, world"


async def test_chat_streaming_chunks(client: httpx.AsyncClient) -> None:
    body = {"messages": USER, "stream": True}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert all(isinstance(c, dict) and set(c) == COMMON_KEYS for c in chunks)
    assert len({c["id"] for c in chunks}) == 1  # type: ignore[index]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)  # type: ignore[index]
    deltas = [c["choices"][0]["delta"] for c in chunks]  # type: ignore[index]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "Hello, world!"
    assert deltas[-1] == {}
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]  # type: ignore[index]
    assert reasons == [None] * (len(chunks) - 1) + ["stop"]


async def test_chat_streaming_include_usage(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    payloads = sse_payloads(await client.post("/v1/chat/completions", json=body))
    *chunks, usage_chunk, done = payloads
    assert done == "[DONE]"
    assert all(c["usage"] is None for c in chunks)  # type: ignore[index]
    assert usage_chunk["choices"] == []  # type: ignore[index]
    num_prompt = len(engine.requests[0].prompt_token_ids)
    assert usage_chunk["usage"] == usage_dict(num_prompt, 4)  # type: ignore[index]


async def test_completions_non_streaming(
    client: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: FakeTokenizer
) -> None:
    response = await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
    body = response.json()
    assert set(body) == COMMON_KEYS | {"usage"} and body["object"] == "text_completion"
    assert body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"text": "Hello,", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"] == usage_dict(4, 2)
    assert tokenizer.calls[-1] == ("abc", True, True)
    assert engine.requests[0].prompt_token_ids == [FAKE_BOS, 100, 101, 102]


async def test_completions_token_id_prompt_is_not_tokenized(
    client: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: FakeTokenizer
) -> None:
    response = await client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 1})
    assert response.status_code == 200
    assert engine.requests[0].prompt_token_ids == [5, 6, 7] and not tokenizer.calls


async def test_completions_streaming(client: httpx.AsyncClient) -> None:
    body = {"prompt": "abc", "stream": True, "stream_options": {"include_usage": True}}
    payloads = sse_payloads(await client.post("/v1/completions", json=body))
    *chunks, usage_chunk, done = payloads
    assert done == "[DONE]"
    assert all(c["object"] == "text_completion" for c in chunks)  # type: ignore[index]
    texts = [c["choices"][0]["text"] for c in chunks]  # type: ignore[index]
    assert "".join(texts) == "Hello, world!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    assert usage_chunk["usage"]["completion_tokens"] == 4  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
async def test_no_worker_ready_is_503_with_retry_after(
    client: httpx.AsyncClient, engine: FakeEngineClient, stream: bool
) -> None:
    engine.raise_on_submit = NoWorkerReady("no engine worker is ready; retry shortly")
    body = {"messages": USER, "stream": stream}
    response = await client.post("/v1/chat/completions", json=body)
    assert_envelope(response, 503, code="no_worker_ready")
    assert response.headers["retry-after"] == "1"


async def test_engine_error_finish_is_500_engine_error(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.finish, engine.error = FinishReason.ERROR, "decode failed"
    response = await client.post("/v1/chat/completions", json={"messages": USER})
    error = assert_envelope(response, 500, code="engine_error")
    assert error["type"] == "server_error" and "decode failed" in str(error["message"])


async def test_engine_error_finish_streams_an_error_event(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.finish, engine.error = FinishReason.ERROR, "decode failed"
    body = {"messages": USER, "stream": True}
    payloads = sse_payloads(await client.post("/v1/chat/completions", json=body))
    assert payloads[-1] == "[DONE]"
    error = payloads[-2]["error"]  # type: ignore[index]
    assert error["code"] == "engine_error" and "decode failed" in error["message"]


async def test_worker_death_non_streaming_is_500_worker_died(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.raise_after = (2, EngineDeadError("the engine worker died; retry the request"))
    response = await client.post("/v1/completions", json={"prompt": "x"})
    assert_envelope(response, 500, code="worker_died")
    assert engine.closed == [engine.requests[0].request_id]


async def test_worker_death_mid_stream_is_an_error_event_then_done(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.raise_after = (2, EngineDeadError("the engine worker died; retry the request"))
    body = {"prompt": "x", "stream": True}
    payloads = sse_payloads(await client.post("/v1/completions", json=body))
    texts = [p["choices"][0]["text"] for p in payloads[:-2]]  # type: ignore[index]
    assert texts == ["Hello", ","]
    assert payloads[-2]["error"]["code"] == "worker_died"  # type: ignore[index]
    assert payloads[-1] == "[DONE]"
    assert engine.closed == [engine.requests[0].request_id]


async def test_unexpected_exception_mid_stream_is_a_generic_error_event(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.raise_after = (1, RuntimeError("secret prompt text"))
    payloads = sse_payloads(
        await client.post("/v1/completions", json={"prompt": "x", "stream": True})
    )
    error = payloads[-2]["error"]  # type: ignore[index]
    assert error["type"] == "server_error" and "secret" not in error["message"]
    assert payloads[-1] == "[DONE]"
