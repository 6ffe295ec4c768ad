"""Tool calling end to end: the `openai` SDK and the `ollama` client against a real
`inferflux serve` with SmolLM2-135M (generic `<tool_call>` format, ChatML template).

With tool_choice "required" or a named function, generation is constrained by the tools'
grammar, so every call must be valid: a known name and arguments that validate against
the function's JSON schema. With "auto" the model may answer in text; the assertions are
then properties that hold either way (no call markup ever leaks into content).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import ollama
import pytest
from openai import OpenAI

from tests.openai_envelope import assert_envelope

pytestmark = [pytest.mark.model, pytest.mark.server]

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "the city name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS = {
    "type": "object",
    "properties": {"timezone": {"type": "string"}},
    "required": ["timezone"],
    "additionalProperties": False,  # else a tiny model pads the call with made-up keys
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current time in a timezone",
            "parameters": TIME_PARAMS,
        },
    },
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
GREEDY = {"temperature": 0, "max_tokens": 96}


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=180) as c:
        yield c


@pytest.fixture(scope="module")
def model(client: OpenAI) -> str:
    return client.models.list().data[0].id


def assert_valid_call(name: str, arguments: str) -> dict[str, object]:
    assert name in SCHEMAS
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, SCHEMAS[name])
    return parsed


def test_required_gives_one_valid_call(client: OpenAI, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"  # the grammar completes after one call
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert_valid_call(call.function.name, call.function.arguments)
    assert choice.message.content is None


def test_required_parallel_calls_are_each_valid(client: OpenAI, model: str) -> None:
    """With parallel calls allowed the model chooses when to stop; a 135M model tends to
    call again until max_tokens. Every complete call is valid; a call cut off by
    max_tokens is dropped (finish_reason "length"), never returned as content."""
    response = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY
    )
    choice = response.choices[0]
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert_valid_call(call.function.name, call.function.arguments)
    assert len({call.id for call in choice.message.tool_calls}) == len(choice.message.tool_calls)
    assert choice.finish_reason in ("tool_calls", "length")
    assert choice.message.content is None


def test_named_function_and_one_call_only(client: OpenAI, model: str) -> None:
    response = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        **GREEDY,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_time"
    assert_valid_call("get_time", call.function.arguments)
    assert choice.message.content is None


def test_streamed_calls_accumulate_with_the_sdk_helper(client: OpenAI, model: str) -> None:
    with client.chat.completions.stream(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    ) as stream:
        contents = [e.delta for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert not any("<tool" in c for c in contents)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert_valid_call(call.function.name, call.function.arguments)


def test_streamed_deltas_by_hand(client: OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", stream=True, **GREEDY
    )
    calls: dict[int, dict[str, str]] = {}
    finish_reasons = []
    for chunk in stream:
        choice = chunk.choices[0]
        finish_reasons.append(choice.finish_reason)
        assert "<tool" not in (choice.delta.content or "")
        for part in choice.delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            if part.id:
                assert part.type == "function" and not call["id"]
                call["id"] = part.id
            if part.function and part.function.name:
                call["name"] += part.function.name
            if part.function and part.function.arguments:
                call["arguments"] += part.function.arguments
    assert finish_reasons[-1] in ("tool_calls", "length")
    assert calls and sorted(calls) == list(range(len(calls)))
    for call in calls.values():
        assert call["id"].startswith("call_")
        assert_valid_call(call["name"], call["arguments"])


def test_auto_answers_with_text_or_valid_calls(client: OpenAI, model: str) -> None:
    for question in ("Hi! How are you?", "What is the weather like in Paris today?"):
        messages = [{"role": "user", "content": question}]
        response = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, **GREEDY
        )
        choice = response.choices[0]
        for call in choice.message.tool_calls or []:
            assert_valid_call(call.function.name, call.function.arguments)
        if not choice.message.tool_calls:
            assert choice.message.content and "<tool_call>" not in choice.message.content
            assert choice.finish_reason in ("stop", "length")


def test_tool_result_goes_back_for_the_next_answer(client: OpenAI, model: str) -> None:
    first = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        **GREEDY,
    )
    message = first.choices[0].message
    assert message.tool_calls
    history: list[object] = [*ASK, message.model_dump(exclude_none=True)]
    for call in message.tool_calls:
        result = {"city": "Paris", "temperature": 21, "unit": "celsius", "sky": "sunny"}
        history.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    second = client.chat.completions.create(
        model=model, messages=history, tools=TOOLS, tool_choice="none", **GREEDY
    )
    answer = second.choices[0]
    assert answer.message.content and not answer.message.tool_calls
    assert answer.finish_reason in ("stop", "length")
    baseline = client.chat.completions.create(model=model, messages=ASK, max_tokens=1)
    assert second.usage and baseline.usage
    # the call and its result were rendered into the prompt
    assert second.usage.prompt_tokens > baseline.usage.prompt_tokens + 30


def test_bad_tool_requests_are_400_naming_the_param(server_url: str) -> None:
    bad_schema = [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]
    cases = [
        ({"tools": bad_schema}, "tools[0].function.parameters"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tool_choice": "required"}, "tool_choice"),
    ]
    with httpx.Client(base_url=server_url, timeout=60) as http:
        for fields, param in cases:
            response = http.post("/v1/chat/completions", json={"messages": ASK, **fields})
            assert_envelope(response, 400, param=param)


def test_ollama_client_history_and_tools(server_url: str, model: str) -> None:
    """The ollama client sends tools and a tool-call history (arguments as objects);
    with the model's earlier call as an example it calls again, in Ollama's shape."""
    messages = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "function": {
                        "name": "get_weather",
                        "arguments": {"city": "Oslo", "unit": "celsius"},
                    }
                }
            ],
        },
        {"role": "tool", "content": '{"temperature": 3}', "tool_name": "get_weather"},
        {"role": "assistant", "content": "It is 3 degrees in Oslo."},
        {"role": "user", "content": "And what is the weather in Paris?"},
    ]
    options = {"temperature": 0, "num_predict": 96}
    with ollama.Client(host=server_url, timeout=180) as client:
        response = client.chat(model=model, messages=messages, tools=TOOLS, options=options)
        streamed = list(
            client.chat(model=model, messages=messages, tools=TOOLS, options=options, stream=True)
        )
    calls = response.message.tool_calls or []
    for call in calls:
        jsonschema.validate(dict(call.function.arguments), SCHEMAS[call.function.name])
    if not calls:
        assert response.message.content and "<tool_call>" not in response.message.content
    streamed_calls = [c for part in streamed for c in part.message.tool_calls or []]
    assert [c.function.name for c in streamed_calls] == [c.function.name for c in calls]
    assert not any("<tool_call>" in (part.message.content or "") for part in streamed)
    assert streamed[-1].done
