"""Anthropic's Messages API end to end: the official `anthropic` SDK against a real
`inferflux serve` (SmolLM2): text, streaming, stop sequences, the token limit, tool use
(forced, streamed, and a tool_result round trip), count_tokens, errors in Anthropic's
shape, and a client that goes away mid-stream."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anthropic
import httpx
import pytest

pytestmark = [pytest.mark.model, pytest.mark.server]

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # the current SDK has no `temperature` argument; others send it


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0) as client:
        yield client  # closed: an unclosed client's sockets warn when collected


@pytest.fixture(scope="module")
def model(served_model: str) -> str:
    return served_model


def test_a_message_has_text_usage_and_a_stop_reason(client: anthropic.Anthropic, model: str):
    message = client.messages.create(
        model=model,
        max_tokens=16,
        system="You are terse.",
        messages=[{"role": "user", "content": "Name a color."}],
        extra_body=GREEDY,
    )
    assert message.id.startswith("msg_") and message.role == "assistant"
    assert message.model == model
    (block,) = message.content
    assert block.type == "text" and block.text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 5 and 0 < message.usage.output_tokens <= 16


def test_the_token_limit_and_a_stop_sequence_are_reported(client: anthropic.Anthropic, model: str):
    prompt = [{"role": "user", "content": "Write a long story about a dragon."}]
    cut = client.messages.create(model=model, max_tokens=3, messages=prompt, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    stopped = client.messages.create(
        model=model, max_tokens=64, messages=prompt, extra_body=GREEDY, stop_sequences=[" "]
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " "
    assert " " not in "".join(b.text for b in stopped.content if b.type == "text")


def test_a_final_assistant_turn_is_continued(client: anthropic.Anthropic, model: str):
    """Prefill: the answer continues the last assistant turn instead of starting anew."""
    messages = [
        {"role": "user", "content": "Count from one to ten in words."},
        {"role": "assistant", "content": "one, two, three,"},
    ]
    message = client.messages.create(
        model=model, max_tokens=8, messages=messages, extra_body=GREEDY
    )
    text = message.content[0].text
    assert "four" in text.lower() and not text.lower().startswith("one")


def test_streaming_gives_the_sdk_the_same_message(client: anthropic.Anthropic, model: str):
    with client.messages.stream(
        model=model,
        max_tokens=12,
        messages=[{"role": "user", "content": "Say hi."}],
        extra_body=GREEDY,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0


def test_a_forced_tool_call_is_a_tool_use_block(client: anthropic.Anthropic, model: str):
    message = client.messages.create(
        model=model,
        max_tokens=64,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    assert message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather" and isinstance(use.input, dict) and "city" in use.input
    answer = client.messages.create(
        model=model,
        max_tokens=16,
        tools=[WEATHER],
        messages=[
            *ASK,
            {"role": "assistant", "content": message.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}],
            },
        ],
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.usage.input_tokens > message.usage.input_tokens


def test_a_streamed_tool_call_arrives_as_input_json(client: anthropic.Anthropic, model: str):
    with client.messages.stream(
        model=model,
        max_tokens=64,
        messages=ASK,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body=GREEDY,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "content_block_start" in kinds
    uses = [b for b in final.content if b.type == "tool_use"]  # any: one call or several
    assert uses and all(u.name == "get_weather" and "city" in u.input for u in uses)
    assert final.stop_reason == "tool_use"


def test_count_tokens_matches_the_prompt_of_a_message(client: anthropic.Anthropic, model: str):
    messages = [{"role": "user", "content": "Name a color."}]
    counted = client.messages.count_tokens(model=model, messages=messages, system="Be brief.")
    message = client.messages.create(
        model=model, max_tokens=2, messages=messages, system="Be brief.", extra_body=GREEDY
    )
    assert counted.input_tokens == message.usage.input_tokens


def test_errors_have_anthropics_shape(client: anthropic.Anthropic, model: str, server_url: str):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=4, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model=model, max_tokens=4, messages=[{"role": "user", "content": [image]}]
        )
    assert "messages[0].content[0]" in str(refused.value)
    raw = httpx.post(f"{server_url}/v1/messages", json={"model": model, "messages": ASK})
    assert raw.status_code == 400
    assert raw.json()["type"] == "error"
    assert raw.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in raw.json()["error"]["message"]


def test_a_client_that_goes_away_frees_the_engine(model: str, server_url: str):
    body = {
        "model": model,
        "max_tokens": 2000,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a very long story."}],
    }
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server_url}/v1/messages", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("event: content_block_delta"):
                    break
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if http.get(f"{server_url}/server/stats").json()["num_running"] == 0:
                break
            time.sleep(0.1)
        assert http.get(f"{server_url}/server/stats").json()["num_running"] == 0
