"""Request validation: every class of bad input → its status, the envelope, and `param`."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from inferflux.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from tests.fakes.engine import FakeEngineClient
from tests.openai_envelope import assert_envelope

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> dict[str, object]:
    return {"messages": USER, **fields}


def tool(name: str = "f", **function: object) -> dict[str, object]:
    return {"type": "function", "function": {"name": name, **function}}


def deep_schema(levels: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def assistant_calls(*calls: object) -> dict[str, object]:
    return {"messages": [{"role": "assistant", "content": None, "tool_calls": list(calls)}]}


CHAT_400 = [
    # (body, param)
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0]"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].image_url.url",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "x": {}}]}]},
        "messages[0].content[0]",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0]",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "messages[0].extra"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=-5), "max_tokens"),
    (chat(max_tokens="10"), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_completion_tokens=0), "max_completion_tokens"),
    (chat(temperature=3), "temperature"),
    (chat(temperature=-0.1), "temperature"),
    (chat(temperature="1"), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(top_p=1.5), "top_p"),
    (chat(top_k=-1), "top_k"),
    (chat(min_p=1.5), "min_p"),
    (chat(n=0), "n"),
    (chat(n=17), "n"),
    (chat(n=2.0), "n"),
    (chat(stop=5), "stop"),
    (chat(stop=[1]), "stop[0]"),
    (chat(stop=""), "stop"),
    (chat(stop=["a", ""]), "stop"),
    (chat(stop=[str(i) for i in range(17)]), "stop"),
    (chat(stop=["x" * 513]), "stop"),
    (chat(stop=["a"] * 500), "stop"),
    (chat(seed="1"), "seed"),
    (chat(seed=2**70), "seed"),
    (chat(presence_penalty=2.5), "presence_penalty"),
    (chat(frequency_penalty=-3), "frequency_penalty"),
    (chat(repeat_penalty=0), "repeat_penalty"),
    (chat(logit_bias={"abc": 1}), "logit_bias"),
    (chat(logit_bias={"-1": 1}), "logit_bias"),
    (chat(logit_bias={"5": 101}), "logit_bias"),
    (chat(logit_bias={"5": "x"}), "logit_bias"),
    (chat(logit_bias={"259": 1}), "logit_bias"),  # n_vocab of the fake model is 259
    (chat(logit_bias=[1]), "logit_bias"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(stream=True, stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
    (chat(stream=True, stream_options={"bogus": 1}), "stream_options.bogus"),
    (chat(ignore_eos=1), "ignore_eos"),
    (chat(model=5), "model"),
    (chat(user=5), "user"),
    (chat(foo=1), "foo"),
    (chat(tools=[{"type": "function"}]), "tools[0].function"),
    (chat(tools=[{"type": "fn", "function": {"name": "f"}}]), "tools[0].type"),
    (chat(tools=[tool("bad name!")]), "tools[0].function.name"),
    (chat(tools=[tool(description=5)]), "tools[0].function.description"),
    (chat(tools=[tool(parameters={"type": "string"})]), "tools[0].function.parameters"),
    (
        chat(tools=[tool(parameters={"type": "object", "properties": {"a": {"type": "nope"}}})]),
        "tools[0].function.parameters",
    ),
    (chat(tools=[tool(parameters="{}")]), "tools[0].function.parameters"),
    (chat(tools=[tool(), tool("g"), tool()]), "tools[2].function.name"),
    (chat(tools=[tool(bogus=1)]), "tools[0].function.bogus"),
    (chat(tools=[tool()], tool_choice="sometimes"), "tool_choice"),
    (
        chat(tools=[tool()], tool_choice={"type": "function", "function": {"name": "g"}}),
        "tool_choice",
    ),
    (chat(tools=[tool()], tool_choice={"type": "function"}), "tool_choice.function"),
    (chat(tools=[tool()], parallel_tool_calls="no"), "parallel_tool_calls"),
    (chat(tools={"f": {}}), "tools"),
    (chat(tools=[tool(parameters=deep_schema(40))]), "tools[0].function.parameters"),
    (chat(response_format={"type": "xml"}), "response_format"),
    (chat(response_format={"type": "json_object", "schema": 3}), "response_format.schema"),
    (
        chat(response_format={"type": "json_object", "schema": {"type": 5}}),
        "response_format.schema",
    ),
    (
        chat(response_format={"type": "json_schema", "json_schema": {"name": "a b"}}),
        "response_format.json_schema.name",
    ),
    (
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {
                        "type": "object",
                        "properties": {"a": {"type": "string", "format": "bogus"}},
                    },
                },
            }
        ),
        "response_format.json_schema.schema",
    ),
    (chat(response_format={"type": "json_object"}, grammar='root ::= "a"'), "grammar"),
    (chat(grammar_syntax="regex"), "grammar_syntax"),
    (chat(grammar="[a-", grammar_syntax="regex"), "grammar"),
    (chat(grammar="start: (", grammar_syntax="lark"), "grammar"),
    (chat(tools=[tool()], response_format={"type": "json_object"}), "tools"),
    (chat(tools=[tool()], tool_choice="required", grammar='root ::= "a"'), "tools"),
    (chat(tool_choice="required"), "tool_choice"),
    (chat(logprobs=1), "logprobs"),
    (chat(top_logprobs=2), "top_logprobs"),
    (chat(logprobs=False, top_logprobs=2), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
    (chat(grammar="x ::= y"), "grammar"),  # the fake tokenizer wants a root rule
    (chat(grammar=""), "grammar"),
    (chat(grammar=5), "grammar"),
    (chat(priority="urgent"), "priority"),
    (chat(priority=1), "priority"),
    (
        chat(response_format={"type": "json_schema", "json_schema": {}}),
        "response_format.json_schema.name",
    ),
    (chat(tool_choice={"type": "function", "function": {"name": "f"}}), "tool_choice"),
    (chat(audio={"voice": "alloy", "format": "mp3"}), "audio"),
    (chat(prediction={"type": "content", "content": "x"}), "prediction"),
    (chat(web_search_options={}), "web_search_options"),
    (chat(verbosity="low"), "verbosity"),
    (chat(echo=True), "echo"),
    (chat(best_of=2), "best_of"),
    (chat(suffix="x"), "suffix"),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        "messages[0].content[0]",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]},
        "messages[0].content[0]",
    ),
    (chat(functions=[{"name": "f"}]), "functions"),
    (chat(modalities=["audio"]), "modalities"),
    (chat(reasoning_effort="high"), "reasoning_effort"),
    (assistant_calls({"id": "1"}), "messages[0].tool_calls[0].function"),
    (
        assistant_calls({"id": "1", "type": "function", "function": {"name": "f"}}),
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        assistant_calls(
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
        ),
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        assistant_calls(
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "[]"}}
        ),
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": "x",
                    "tool_calls": [
                        {
                            "id": "1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                }
            ]
        },
        "messages[0].tool_calls",
    ),
]


@pytest.mark.parametrize(("body", "param"), CHAT_400)
async def test_chat_bad_input_is_400_naming_the_param(
    client: httpx.AsyncClient, engine: FakeEngineClient, body: dict[str, object], param: str
) -> None:
    response = await client.post("/v1/chat/completions", json=body)
    error = assert_envelope(response, 400, param=param)
    assert error["type"] == "invalid_request_error"
    assert not engine.requests


COMPLETION_400 = [
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [""]}, "prompt"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt[1]"),
    ({"prompt": [[1], []]}, "prompt[1]"),
    ({"prompt": ["a"] * 65}, "prompt"),
    ({"prompt": ["a"] * 5, "n": 16}, "prompt"),
    ({"prompt": [[1], ["a"]]}, "prompt[1][0]"),
    ({"prompt": ["a", 1]}, "prompt[1]"),
    ({"prompt": [1, 999]}, "prompt"),
    ({"prompt": [-1]}, "prompt"),
    ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "best_of": 2, "n": 3}, "best_of"),
    ({"prompt": "x", "n": 17}, "n"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"prompt": "x", "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"prompt": "x", "grammar": "nope"}, "grammar"),
    ({"prompt": "x", "priority": "HIGH"}, "priority"),
    ({"prompt": "x", "tools": []}, "tools"),
    ({"prompt": "x", "messages": USER}, "messages"),
    ({"prompt": "x", "max_completion_tokens": 5}, "max_completion_tokens"),
]


@pytest.mark.parametrize(("body", "param"), COMPLETION_400)
async def test_completion_bad_input_is_400_naming_the_param(
    client: httpx.AsyncClient, body: dict[str, object], param: str
) -> None:
    response = await client.post("/v1/completions", json=body)
    assert_envelope(response, 400, param=param)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(
    "raw",
    [b"{bad json", b"", b"[1, 2]", b'"text"', b"null", b"42", b'{"messages": "\xff"}', b"\xff\xfe"],
)
async def test_unparseable_or_non_object_body_is_400(
    client: httpx.AsyncClient, path: str, raw: bytes
) -> None:
    response = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert_envelope(response, 400, code="invalid_request")


async def test_body_without_content_type_is_parsed(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", content=b'{"messages": [1]}')
    assert_envelope(response, 400, param="messages[0]")


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat(model="gpt-4o"))
    error = assert_envelope(response, 404, param="model", code="model_not_found")
    assert "gpt-4o" in str(error["message"])


async def test_context_length_exceeded(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x" * 300})
    error = assert_envelope(response, 400, param="prompt", code="context_length_exceeded")
    assert "256" in str(error["message"]) and "301" in str(error["message"])


async def test_prompt_plus_max_tokens_over_context(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x" * 100, "max_tokens": 200})
    error = assert_envelope(response, 400, code="context_length_exceeded")
    assert "101 prompt tokens + 200" in str(error["message"])


async def test_chat_context_length_names_messages(client: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": "y" * 400}]}
    response = await client.post("/v1/chat/completions", json=body)
    assert_envelope(response, 400, param="messages", code="context_length_exceeded")


@pytest.mark.parametrize(
    "hint",
    [
        {"user": "u-1"},
        {"store": False},
        {"metadata": {"k": "v"}},
        {"service_tier": "auto"},
        {"parallel_tool_calls": False},
        {"prompt_cache_key": "k"},
        {"safety_identifier": "s"},
        {"response_format": {"type": "text"}},
        {"tools": []},
        {"tool_choice": "none"},
        {"logprobs": False},
        {"n": 1},
        {"stream": False},
        {"stream": True, "stream_options": {"include_obfuscation": False}},
        {"model": "fake-model"},
        {"model": None, "temperature": None, "max_tokens": None},
    ],
)
async def test_optional_hints_and_defaults_are_accepted(
    client: httpx.AsyncClient, hint: dict[str, object]
) -> None:
    response = await client.post("/v1/chat/completions", json=chat(**hint))
    assert response.status_code == 200, response.text


def test_huge_logit_bias_is_refused() -> None:
    body = chat(logit_bias={str(i): 1 for i in range(1025)})
    with pytest.raises(ValidationError) as refused:
        ChatCompletionRequest.model_validate(body)
    assert refused.value.errors()[0]["loc"] == ("logit_bias",)


def test_sampling_params_mapping() -> None:
    body = ChatCompletionRequest.model_validate(
        chat(
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            min_p=0.05,
            seed=7,
            stop="END",
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repeat_penalty=1.1,
            logit_bias={"10": -100, "11": 5.5},
            ignore_eos=True,
            max_tokens=99,
            max_completion_tokens=12,
        )
    )
    assert body.requested_max_tokens() == 12  # max_completion_tokens wins
    sampling = body.sampling_params(12)
    assert sampling.max_tokens == 12
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (
        0.5,
        0.9,
        40,
        0.05,
    )
    assert sampling.seed == 7 and sampling.stop == ["END"] and sampling.ignore_eos
    assert sampling.logit_bias == {10: -100.0, 11: 5.5}
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.5)
    assert sampling.repeat_penalty == 1.1


def test_sampling_defaults() -> None:
    sampling = CompletionRequest.model_validate({"prompt": "x"}).sampling_params(5)
    assert sampling.temperature == 1.0 and sampling.top_p == 1.0 and sampling.top_k == 0
    assert sampling.seed is None and sampling.stop == [] and sampling.logit_bias == {}


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("abc", ["abc"]),
        (["abc"], ["abc"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2], [[1, 2]]),
        ([[3, 4]], [[3, 4]]),
        ([[3], [4, 5]], [[3], [4, 5]]),
    ],
)
def test_prompt_forms(prompt: object, expected: object) -> None:
    assert CompletionRequest.model_validate({"prompt": prompt}).prompt_inputs() == expected


def test_developer_role_renders_as_system_and_parts_join() -> None:
    body = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "rules"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
                {"role": "tool", "content": "42", "tool_call_id": "t1"},
            ]
        }
    )
    assert body.template_messages() == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "42", "tool_call_id": "t1"},
    ]
