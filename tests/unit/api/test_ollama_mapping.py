"""Pure mapping functions of the Ollama API: options → sampling, durations, names, formats."""

from __future__ import annotations

import math
import time

import pytest
from pydantic import ValidationError

from inferflux.api.errors import error_body
from inferflux.api.generation import Choice, GenerationPlan, Timings, TokenTexts
from inferflux.api.generation.planner import compile_output
from inferflux.api.generation.service import ChoiceRun
from inferflux.api.ollama.embed import shorten
from inferflux.api.ollama.models import human_number, ollama_name, parameters_text, resolve_model
from inferflux.api.ollama.protocol import (
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaOptions,
    format_output,
    parse_keep_alive,
    requested_max_tokens,
    sampling_params,
)
from inferflux.api.ollama.render import done_fields, done_reason, metrics_of, rfc3339_nano
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta, SamplingParams
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import EngineError, InvalidRequest, ModelNotFound, QueueTimeout
from inferflux.security.principal import ANONYMOUS
from tests.fakes.engine import FakeTokenizer


async def format_constraint(format_: object, compiler: ConstraintCompiler):
    """Ollama's `format` as the service compiles it."""
    return await compile_output(compiler, format_output(format_))


def _info(model_id: str = "smol") -> ModelInfo:
    return ModelInfo(
        model_id=model_id,
        path="/models/smol.gguf",
        architecture="llama",
        n_ctx=4096,
        n_ctx_train=8192,
        n_vocab=49152,
        size_bytes=1000,
        created=1_700_000_000,
        has_chat_template=True,
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (0, 0.0),
        (30, 30.0),
        (1.5, 1.5),
        (-1, math.inf),
        ("0", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("250ms", 0.25),
        ("-1m", math.inf),
        ("-1", math.inf),
        ("300", 300.0),
    ],
)
def test_keep_alive_durations(value: float | str | None, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("text", ["", "m", "5 minutes", "5m3", "1d", "soon"])
def test_keep_alive_rejects_non_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_keep_alive(text)


def test_unset_options_get_ollamas_defaults() -> None:
    params = sampling_params(None, max_tokens=7, n_ctx=4096)
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (7, 0.8, 0.9, 40)
    assert (params.repeat_penalty, params.penalty_last_n, params.min_p) == (1.1, 64, 0.0)
    assert params.seed is None and params.stop == [] and params.logprobs is None


def test_options_map_to_sampling_params() -> None:
    options = OllamaOptions.model_validate(
        {
            "temperature": 0,
            "top_p": 0.5,
            "top_k": -1,
            "min_p": 0.05,
            "seed": 42,
            "repeat_penalty": 0,
            "repeat_last_n": -1,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "stop": "\n",
            "num_ctx": 2048,
            "num_gpu": 99,
        }
    )
    params = sampling_params(options, max_tokens=3, n_ctx=4096, logprobs=2)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.0, 0.5, 0, 0.05)
    assert params.seed == 42 and params.repeat_penalty == 1.0 and params.penalty_last_n == 4096
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)
    assert params.stop == ["\n"] and params.logprobs == 2
    assert sampling_params(OllamaOptions(seed=-1), max_tokens=1, n_ctx=8).seed is None


@pytest.mark.parametrize(
    ("num_predict", "expected"), [(None, None), (-1, None), (-2, None), (0, None), (5, 5)]
)
def test_num_predict(num_predict: int | None, expected: int | None) -> None:
    assert requested_max_tokens(OllamaOptions(num_predict=num_predict)) == expected


@pytest.mark.parametrize(
    "options",
    [
        {"mirostat": 3},
        {"typical_p": 0.0},
        {"dry_base": 0.5},
        {"samplers": ["top_k", "top_k"]},
        {"samplers": ["beam"]},
        {"temperature": "0.5"},
        {"top_p": 1.5},
        {"stop": [""]},
        {"stop": ["x"] * 17},
        {"repeat_last_n": -2},
    ],
)
def test_options_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OllamaOptions.model_validate(options)


def test_llama_cpp_samplers_map_to_the_engine() -> None:
    options = OllamaOptions.model_validate(
        {
            "mirostat": 2,
            "mirostat_tau": 3.0,
            "typical_p": 0.9,
            "dry_multiplier": 0.8,
            "xtc_probability": 0.5,
            "samplers": ["top_k", "temperature"],
            "repeat_last_n": -1,
        }
    )
    params = sampling_params(options, max_tokens=1, n_ctx=8)
    assert (params.mirostat, params.mirostat_tau, params.typical_p) == (2, 3.0, 0.9)
    assert (params.dry_multiplier, params.xtc_probability) == (0.8, 0.5)
    assert params.samplers == ["top_k", "temperature"] and params.penalty_last_n == 8


def test_unknown_options_and_fields_are_ignored_like_ollama() -> None:
    options = OllamaOptions.model_validate({"mirostat": 0, "typical_p": 1.0, "made_up": 1})
    assert sampling_params(options, max_tokens=1, n_ctx=8).temperature == 0.8
    body = OllamaGenerateRequest.model_validate_json('{"model": "m", "prompt": "p", "width": 5}')
    assert body.prompt == "p" and body.streaming()


def test_stream_defaults_to_true_and_priority_maps() -> None:
    body = OllamaChatRequest.model_validate({"model": "m", "stream": False, "priority": "low"})
    assert not body.streaming() and body.engine_priority().value == "low"
    assert OllamaChatRequest.model_validate({"model": "m"}).streaming()


def test_chat_tools_and_tool_history_map_to_the_template() -> None:
    with pytest.raises(ValidationError):
        OllamaChatRequest.model_validate({"model": "m", "tools": [{"type": "function"}]})
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = OllamaChatRequest.model_validate(
        {
            "model": "m",
            "tools": [tool],
            "messages": [
                {"role": "user", "content": "x"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
                },
                {"role": "tool", "content": "4", "tool_name": "f"},
            ],
        }
    )
    plan = body.tool_plan()
    assert plan is not None and plan.names() == {"f"} and plan.parallel and not plan.required
    assistant = body.template_messages()[1]
    [call] = assistant["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": {"a": 1}}
    assert str(call["id"]).startswith("call_")
    misplaced = OllamaChatRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}
            ],
        }
    )
    with pytest.raises(InvalidRequest) as raised:
        misplaced.template_messages()
    assert raised.value.param == "messages[0].tool_calls"


def test_chat_messages_refuse_images() -> None:
    images = OllamaChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}
    )
    with pytest.raises(InvalidRequest) as raised:
        images.template_messages()
    assert raised.value.param == "messages[0].images"
    empty_tools = OllamaChatRequest.model_validate(
        {
            "model": "m",
            "tools": [],
            "messages": [{"role": "tool", "content": "4", "tool_name": "f"}],
        }
    )
    assert empty_tools.template_messages() == [{"role": "tool", "content": "4", "name": "f"}]


async def test_format_maps_to_a_json_constraint() -> None:
    compiler = ConstraintCompiler(FakeTokenizer().constraint_error)
    assert await format_constraint(None, compiler) is None
    assert await format_constraint("", compiler) is None
    any_object = await format_constraint("json", compiler)
    assert any_object is not None
    assert any_object.check('{"a": 1}') is None and any_object.check("[1]") is not None
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    typed = await format_constraint(schema, compiler)
    assert typed is not None and typed.grammar != any_object.grammar
    assert typed.check('{"n": 3}') is None and typed.check('{"n": "3"}') is not None
    with pytest.raises(InvalidRequest, match="expected") as refused:
        await format_constraint("xml", compiler)
    assert refused.value.param == "format"
    with pytest.raises(InvalidRequest, match="invalid JSON schema"):
        await format_constraint({"type": "nonsense"}, compiler)


def test_rfc3339_nano_like_go() -> None:
    assert rfc3339_nano(0) == "1970-01-01T00:00:00Z"
    assert rfc3339_nano(1_500_000_000) == "1970-01-01T00:00:01.5Z"
    assert rfc3339_nano(123_456_789) == "1970-01-01T00:00:00.123456789Z"


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (134_515_008, "134.52M"),
        (7_000_000_000, "7B"),
        (3_210_000_000, "3.2B"),
        (512_000, "512K"),
        (999, "999"),
    ],
)
def test_human_number_like_ollama(count: int, text: str) -> None:
    assert human_number(count) == text


def test_model_names() -> None:
    info = _info()  # resolve_model checks the caller's model rights: ANONYMOUS has them all
    assert ollama_name(info) == "smol:latest" and ollama_name(_info("smol:q4")) == "smol:q4"
    assert resolve_model("smol", info, ANONYMOUS) == "smol"
    assert resolve_model("smol:latest", info, ANONYMOUS) == "smol:latest"
    with pytest.raises(ModelNotFound, match="^model 'llama3' not found$"):
        resolve_model("llama3", info, ANONYMOUS)
    with pytest.raises(InvalidRequest, match="model is required"):
        resolve_model("", info, ANONYMOUS)
    assert parameters_text(info).splitlines()[0] == "num_ctx" + " " * 24 + "4096"


def test_done_reason_and_metrics() -> None:
    assert done_reason(FinishReason.LENGTH) == "length"
    assert {done_reason(r) for r in (FinishReason.STOP, FinishReason.STOP_SEQUENCE)} == {"stop"}
    add = AddRequest(
        request_id="r", prompt_token_ids=[1, 2, 3, 4], sampling=SamplingParams(max_tokens=8)
    )
    choice = Choice(0, 0, add)
    run = ChoiceRun(choice, TokenTexts(FakeTokenizer()), GenerationPlan("r", [choice]), keep=True)
    run.feed(RequestDelta(request_id="r", text="a", token_ids=[5], num_output_tokens=1))
    run.feed(
        RequestDelta(
            request_id="r", token_ids=[2], num_output_tokens=2, finish_reason=FinishReason.STOP
        )
    )
    assert run.result is not None
    now = time.monotonic_ns()
    metrics = metrics_of(run.result, Timings(100, now, now, now, now))
    assert all(isinstance(v, int) and v >= 1 for v in metrics.values())
    assert metrics["eval_count"] == 2 and run.result.output_token_ids == [5, 2]
    assert done_fields(run.result) == {"done": True, "done_reason": "stop"}
    with pytest.raises(EngineError):
        run.feed(RequestDelta(request_id="r", finish_reason=FinishReason.ERROR, error="x"))
    with pytest.raises(QueueTimeout):
        run.feed(RequestDelta(request_id="r", finish_reason=FinishReason.TIMEOUT))


def test_shorten_renormalizes() -> None:
    assert shorten([0.6, 0.8, 0.0], None) == [0.6, 0.8, 0.0]
    assert shorten([3.0, 4.0, 5.0], 2) == pytest.approx([0.6, 0.8])


def test_error_body_shape_follows_the_path() -> None:
    error = InvalidRequest("bad", param="x")
    assert error_body(error, "/api/chat") == {"error": "bad"}
    assert error_body(error, "/v1/chat/completions") == error.to_body()
    assert error_body(error) == error.to_body()
