"""The second test model over HTTP: Gemma 3 270M, a base model whose GGUF has no chat template."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import pytest
from openai import OpenAI

from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def gemma_server(gemma3_model_path: str, tmp_path_factory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("log") / "gemma.log"
    args = ("--model", gemma3_model_path, "--model-id", "gemma-3-270m")
    proc = ServerProcess(*args, env={"INFERFLUX_MODEL__CTX_SIZE": "1024"}, log_path=log)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.close()


@pytest.fixture(scope="module")
def client(gemma_server) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{gemma_server.url}/v1", api_key="unused") as sdk:
        yield sdk


def test_chat_uses_the_gemma_fallback_template_and_stops_at_end_of_turn(
    gemma_server, client: OpenAI
) -> None:
    reply = client.chat.completions.create(
        model="gemma-3-270m",
        messages=[
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "What color is the sky on a clear day?"},
        ],
        max_tokens=48,
        temperature=0,
    )
    content = reply.choices[0].message.content or ""
    assert content.strip()
    assert "<end_of_turn>" not in content and "<start_of_turn>" not in content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 10


def test_streaming_completion_and_model_listing(
    gemma_server: ServerProcess, client: OpenAI
) -> None:
    models = httpx.get(f"{gemma_server.url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["gemma-3-270m"]
    stream = client.completions.create(
        model="gemma-3-270m",
        prompt="The capital of France is",
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert text.strip()


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_tool_calls_through_the_generic_prompt_and_the_gemma_fallback(
    gemma_server, client: OpenAI
) -> None:
    """Gemma's fallback template has no tool support: the generic format describes the
    tool in the (folded) system turn; a required call is valid under its schema, and the
    tool result renders back as a user turn for the next answer."""
    ask = [{"role": "user", "content": "What is the weather in Lima?"}]
    first = client.chat.completions.create(
        model="gemma-3-270m",
        messages=ask,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_TOOL["function"]["parameters"])
    history = [
        *ask,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 19}'},
    ]
    second = client.chat.completions.create(
        model="gemma-3-270m", messages=history, max_tokens=32, temperature=0
    )
    baseline = client.chat.completions.create(model="gemma-3-270m", messages=ask, max_tokens=1)
    assert second.choices[0].message.content
    assert second.usage and baseline.usage
    # the call and its result were rendered as text turns of the conversation
    assert second.usage.prompt_tokens > baseline.usage.prompt_tokens + 20
