"""n choices, prompt batches, echo, logprobs, usage, priority and queue errors over the fake
engine (response assembly only; real generation is tested in tests/integration)."""

from __future__ import annotations

import httpx
import pytest

from inferflux.api.generation.planner import derive_seed
from inferflux.api.openai.compat import ACCEPTED_IGNORED
from inferflux.api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonSchemaSpec,
    StreamOptions,
)
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.messages import FinishReason, Priority
from inferflux.errors import EngineDeadError, InvalidRequest, QueueFull, QueueTimeout
from tests.fakes.engine import FAKE_BOS, FakeEngineClient, FakeTokenizer
from tests.openai_envelope import assert_envelope
from tests.unit.api.test_routes import sse_payloads

USER = [{"role": "user", "content": "hi"}]
FULL = "Hello, world!"


def chunks_of(response: httpx.Response) -> list[dict]:
    payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    return payloads[:-1]  # type: ignore[return-value]


async def test_chat_n_gives_n_choices_from_n_engine_requests(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"messages": USER, "n": 3, "seed": 5}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert all(c["message"]["content"] == FULL for c in data["choices"])
    assert all(c["finish_reason"] == "stop" for c in data["choices"])
    ids = [r.request_id for r in engine.requests]
    assert len(set(ids)) == 3 and ids[0] == data["id"]
    seeds = [r.sampling.seed for r in engine.requests]
    assert seeds[0] == 5 and len(set(seeds)) == 3
    num_prompt = len(engine.requests[0].prompt_token_ids)
    assert data["usage"]["prompt_tokens"] == num_prompt  # the prompt counts once
    assert data["usage"]["completion_tokens"] == 12
    assert set(engine.closed) == set(ids)


async def test_n_without_seed_leaves_every_choice_random(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    await client.post("/v1/chat/completions", json={"messages": USER, "n": 2})
    assert [r.sampling.seed for r in engine.requests] == [None, None]


def test_derived_seeds_are_reproducible_and_in_range() -> None:
    assert derive_seed(None, 3) is None and derive_seed(7, 0) == 7
    assert derive_seed(7, 1) == derive_seed(7, 1) != derive_seed(8, 1)
    assert 0 <= derive_seed(2**64 - 1, 5) < 2**64  # type: ignore[operator]
    assert 0 <= derive_seed(-(2**63), 5) < 2**64  # type: ignore[operator]


async def test_chat_n_streams_every_choice_by_index(client: httpx.AsyncClient) -> None:
    body = {
        "messages": USER,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    *chunks, usage = chunks_of(await client.post("/v1/chat/completions", json=body))
    assert all(len(c["choices"]) == 1 for c in chunks)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(m["delta"].get("content", "") for m in mine) == FULL
        assert [m["finish_reason"] for m in mine][-1] == "stop"
        assert [m["finish_reason"] for m in mine].count("stop") == 1
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8


async def test_completion_prompt_batch_orders_choices_by_prompt_then_n(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"prompt": ["ab", "c"], "n": 2, "max_tokens": 1}
    data = (await client.post("/v1/completions", json=body)).json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2, 3]
    prompts = [r.prompt_token_ids for r in engine.requests]
    assert prompts == [[FAKE_BOS, 100, 101]] * 2 + [[FAKE_BOS, 102]] * 2
    assert data["usage"]["prompt_tokens"] == 3 + 2  # each prompt once
    assert data["usage"]["completion_tokens"] == 4


async def test_completion_token_array_batch(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    data = (await client.post("/v1/completions", json={"prompt": [[5, 6], [7]]})).json()
    assert len(data["choices"]) == 2
    assert [r.prompt_token_ids for r in engine.requests] == [[5, 6], [7]]


async def test_echo_prepends_the_prompt(client: httpx.AsyncClient) -> None:
    data = (await client.post("/v1/completions", json={"prompt": "ab", "echo": True})).json()
    assert data["choices"][0]["text"] == "ab" + FULL
    body = {"prompt": [100, 101], "echo": True, "stream": True}
    chunks = chunks_of(await client.post("/v1/completions", json=body))
    assert chunks[0]["choices"][0]["text"] == "ab"  # token prompts echo their text
    assert "".join(c["choices"][0]["text"] for c in chunks) == "ab" + FULL


async def test_echo_with_logprobs_reports_the_prompt_first_null(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"prompt": "ab", "echo": True, "logprobs": 2, "max_tokens": 2}
    data = (await client.post("/v1/completions", json=body)).json()
    sampling = engine.requests[0].sampling
    assert (sampling.logprobs, sampling.prompt_logprobs) == (2, 2)
    logprobs = data["choices"][0]["logprobs"]
    # the prompt (BOS, "a", "b"), then the generated bytes of "Hello,"
    assert logprobs["tokens"] == ["", "a", "b", *"Hello,"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:] == [-0.5] * 8
    assert logprobs["text_offset"] == [0, 0, 1, 2, 3, 4, 5, 6, 7]  # BOS has no text
    assert data["choices"][0]["text"] == "abHello,"


async def test_completion_logprobs_without_echo(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"prompt": "ab", "logprobs": 0}
    data = (await client.post("/v1/completions", json=body)).json()
    assert engine.requests[0].sampling.prompt_logprobs is None
    logprobs = data["choices"][0]["logprobs"]
    assert "".join(logprobs["tokens"]) == FULL  # the end token is not shown
    assert logprobs["top_logprobs"][0] == {"H": -0.5}  # logprobs=0: the sampled token only


async def test_chat_logprobs_follow_the_text(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"messages": USER, "logprobs": True, "top_logprobs": 2}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    assert engine.requests[0].sampling.logprobs == 2
    content = data["choices"][0]["logprobs"]["content"]
    assert "".join(item["token"] for item in content) == FULL
    assert all(len(item["top_logprobs"]) == 2 for item in content)
    assert content[0]["bytes"] == [ord("H")]
    stream = await client.post("/v1/chat/completions", json={**body, "stream": True})
    for chunk in chunks_of(stream)[1:-1]:
        choice = chunk["choices"][0]
        tokens = [item["token"] for item in choice["logprobs"]["content"]]
        assert "".join(tokens) == choice["delta"]["content"]


async def test_chat_logprobs_true_alone_means_no_alternatives(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body = {"messages": USER, "logprobs": True}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    assert engine.requests[0].sampling.logprobs == 0
    assert all(not i["top_logprobs"] for i in data["choices"][0]["logprobs"]["content"])


async def test_cached_tokens_are_reported(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.num_cached_tokens = 3
    data = (await client.post("/v1/completions", json={"prompt": "abcd", "n": 2})).json()
    assert data["usage"]["prompt_tokens_details"]["cached_tokens"] == 3


@pytest.mark.parametrize(("priority", "expected"), [(None, "normal"), ("high", "high")])
async def test_priority_and_extras_reach_the_engine(
    client: httpx.AsyncClient, engine: FakeEngineClient, priority: str | None, expected: str
) -> None:
    body = {"prompt": "x", "priority": priority, "grammar": "root ::= [a-z]+", "top_k": 3}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    request = engine.requests[0]
    assert request.priority is Priority(expected)
    assert request.sampling.constraint is not None and request.sampling.top_k == 3


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("error", "status", "retry_after"),
    [(QueueTimeout("waited too long"), 408, "1"), (QueueFull("queue is full"), 503, "2")],
)
async def test_queue_errors_keep_their_status(
    client: httpx.AsyncClient,
    engine: FakeEngineClient,
    stream: bool,
    error: Exception,
    status: int,
    retry_after: str,
) -> None:
    engine.raise_on_submit = error
    body = {"messages": USER, "n": 2, "stream": stream}
    response = await client.post("/v1/chat/completions", json=body)
    assert_envelope(response, status)
    assert response.headers["retry-after"] == retry_after


@pytest.mark.parametrize("stream", [False, True])
async def test_timeout_finish_is_408(
    client: httpx.AsyncClient, engine: FakeEngineClient, stream: bool
) -> None:
    engine.pieces, engine.finish = [], FinishReason.TIMEOUT
    body = {"prompt": "x", "stream": stream}
    response = await client.post("/v1/completions", json=body)
    assert_envelope(response, 408, code="queue_timeout")


async def test_worker_death_with_n_choices_ends_the_stream_and_closes_all(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.raise_after = (2, EngineDeadError("the engine worker died"))
    body = {"prompt": "x", "n": 3, "stream": True}
    payloads = chunks_of(await client.post("/v1/completions", json=body))
    assert payloads[-1]["error"]["code"] == "worker_died"
    assert sorted(engine.closed) == sorted(r.request_id for r in engine.requests)
    assert len(engine.requests) == 3


async def test_engine_error_before_any_token_is_500(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.pieces, engine.finish, engine.error = [], FinishReason.ERROR, "bad sampler"
    body = {"messages": USER, "stream": True}
    response = await client.post("/v1/chat/completions", json=body)
    assert_envelope(response, 500, code="engine_error")


@pytest.mark.parametrize(
    "hint",
    [
        {"n": 2},
        {"logprobs": False},
        {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True},
        {"functions": [], "function_call": "none"},
        {"modalities": ["text"]},
        {"response_format": {"type": "text"}},
        {"priority": "low"},
        {"metadata": {"a": "b"}, "store": True, "user": "u", "service_tier": "flex"},
        {"audio": None, "prediction": None, "reasoning_effort": None},
    ],
)
async def test_chat_accepts_hints(client: httpx.AsyncClient, hint: dict[str, object]) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": USER, **hint})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "hint",
    [{"best_of": 2, "n": 2}, {"best_of": 1}, {"suffix": ""}, {"echo": False}, {"user": "u"}],
)
async def test_completions_accept_hints(client: httpx.AsyncClient, hint: dict[str, object]) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x", **hint})
    assert response.status_code == 200, response.text


def test_every_accepted_hint_is_a_request_field() -> None:
    fields = (
        set(ChatCompletionRequest.model_fields)
        | set(CompletionRequest.model_fields)
        | {f"stream_options.{name}" for name in StreamOptions.model_fields}
        | {f"response_format.json_schema.{name}" for name in JsonSchemaSpec.model_fields}
    )
    for entry in ACCEPTED_IGNORED:
        for name in entry.split(" / "):
            assert name in fields, name


async def test_retrieve_model(client: httpx.AsyncClient) -> None:
    card = (await client.get("/v1/models/fake-model")).json()
    assert card["id"] == "fake-model" and card["object"] == "model"
    for unknown in ("gpt-4o", "org/name"):
        response = await client.get(f"/v1/models/{unknown}")
        assert_envelope(response, 404, param="model", code="model_not_found")


async def test_tokenize_prompt_and_detokenize_round_trip(client: httpx.AsyncClient) -> None:
    data = (await client.post("/tokenize", json={"prompt": "ab"})).json()
    assert data == {"count": 3, "max_model_len": 256, "tokens": [1, 100, 101], "token_strs": None}
    plain = await client.post("/tokenize", json={"prompt": "ab", "add_special": False})
    assert plain.json()["tokens"] == [100, 101]
    strs = await client.post("/tokenize", json={"prompt": "ab", "return_token_strs": True})
    assert strs.json()["token_strs"] == ["", "a", "b"]
    back = await client.post("/detokenize", json={"tokens": data["tokens"]})
    assert back.json() == {"prompt": "ab"}


async def test_tokenize_messages_counts_what_chat_submits(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    counted = (await client.post("/tokenize", json={"messages": USER})).json()
    await client.post("/v1/chat/completions", json={"messages": USER})
    assert counted["tokens"] == engine.requests[0].prompt_token_ids


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": USER}, 400, "prompt"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"prompt": "a", "bogus": 1}, 400, "bogus"),
        ("/tokenize", {"prompt": "a", "add_special": True, "add_special_tokens": False}, 400, None),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
        ("/detokenize", {"tokens": [999]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
        ("/detokenize", {"tokens": 5}, 400, "tokens"),
        ("/detokenize", {}, 400, "tokens"),
    ],
)
async def test_tokenizer_routes_refuse_bad_input(
    client: httpx.AsyncClient, path: str, body: dict[str, object], status: int, param: str | None
) -> None:
    assert_envelope(await client.post(path, json=body), status, param=param)


@pytest.mark.parametrize(
    "grammar",
    [
        "root ::= " + "(" * 2049 + '"a"' + ")" * 2049,  # deep: refused, the process lives
        "root ::= " + "(" * 40_000 + '"a"' + ")" * 40_000,  # overflowed llama.cpp's parser
        "root ::= x\n" + "# " + "a" * 65_536,  # over structured_output.max_grammar_chars
    ],
)
def test_grammar_size_and_nesting_are_bounded(grammar: str) -> None:
    compiler = ConstraintCompiler(FakeTokenizer().constraint_error)
    with pytest.raises(InvalidRequest) as refused:
        compiler.gbnf(grammar, param="grammar")
    assert refused.value.param == "grammar"


def test_reasonable_grammar_passes_the_bounds() -> None:
    compiler = ConstraintCompiler(FakeTokenizer().constraint_error)
    assert compiler.gbnf('root ::= ("a" | "b")+ ' + "(" * 100 + '"c"' + ")" * 100, param="g")
