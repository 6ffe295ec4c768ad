"""The generation service over the fake engine: the typed events a dialect renders, the
collected result, tool-call parts, the structured-output check, usage and aborts. (Real
generation through every dialect is tested in tests/integration.)"""

from __future__ import annotations

import pytest

from inferflux.api.generation import (
    ChatPrompt,
    ChoiceClosed,
    ChoiceOpened,
    ChoiceOutput,
    GenerationDone,
    GenerationService,
    GenerationSpec,
    JsonOutput,
    SamplingParams,
    TextPrompt,
    TokenPrompt,
)
from inferflux.api.telemetry import make_telemetry
from inferflux.api.tools import ToolCall, resolve_tools
from inferflux.api.tools.protocol import ToolDefinition
from inferflux.config.settings import Settings
from inferflux.engine.messages import FinishReason, Priority
from inferflux.errors import ContextLengthExceeded, EngineError, InvalidRequest
from inferflux.models.resident import build_serving
from inferflux.models.serving import ClientEngine, ServingState
from inferflux.security.context import RequestContext
from inferflux.security.principal import ANONYMOUS
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info

CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def serving_over(engine: FakeEngineClient, n_ctx: int = 256) -> ServingState:
    info = fake_model_info(n_ctx=n_ctx)
    return build_serving(Settings(), engine, FakeTokenizer(), info, lambda e, t, i: ClientEngine(e))


def service() -> GenerationService:
    return GenerationService(make_telemetry(Settings(), lambda: [], fake_model_info()))


def context() -> RequestContext:
    return RequestContext("req-1", started_at=0.0, principal=ANONYMOUS)


def spec(*prompts, n: int = 1, max_tokens: int | None = 8, **fields) -> GenerationSpec:
    def sampling(limit: int) -> SamplingParams:
        return SamplingParams(max_tokens=limit, temperature=0, seed=fields.pop("seed", 7))

    return GenerationSpec(
        id_prefix="test",
        prompts=list(prompts) or [TextPrompt("hi")],
        sampling=sampling,
        prompt_param="prompt",
        n=n,
        max_tokens=max_tokens,
        **fields,
    )


async def test_events_open_every_choice_then_interleave_then_finish() -> None:
    engine = FakeEngineClient()
    started = await service().start(serving_over(engine), spec(n=2), context())
    events = [event async for event in started.events()]
    assert [type(e) for e in events[:2]] == [ChoiceOpened, ChoiceOpened]
    assert isinstance(events[-1], GenerationDone)
    texts = {0: "", 1: ""}
    for event in events:
        if isinstance(event, ChoiceOutput):
            texts[event.index] += "".join(p for p in event.parts if isinstance(p, str))
    assert texts == {0: "Hello, world!", 1: "Hello, world!"}
    closed = [e for e in events if isinstance(e, ChoiceClosed)]
    assert sorted(c.result.index for c in closed) == [0, 1]
    done = events[-1].result
    assert done.usage.prompt_tokens == len(engine.requests[0].prompt_token_ids)  # once
    assert done.usage.completion_tokens == 8
    seeds = [r.sampling.seed for r in engine.requests]
    assert seeds[0] == 7 and seeds[1] != 7  # the second choice derives its own seed
    assert sorted(engine.closed) == sorted(r.request_id for r in engine.requests)


async def test_collect_keeps_text_and_token_ids() -> None:
    engine = FakeEngineClient()
    started = await service().start(serving_over(engine), spec(), context())
    result = await started.collect()
    (choice,) = result.choices
    assert choice.text == "Hello, world!" and choice.finish_reason is FinishReason.STOP
    assert choice.output_token_ids == [7, 7, 7, 7] and choice.num_output_tokens == 4
    assert result.timings.started_ns <= result.timings.submitted_ns
    assert result.timings.first_token_ns is not None


async def test_the_last_output_says_it_closes_the_choice() -> None:
    engine = FakeEngineClient(pieces=["a", "b"])
    engine.finish = FinishReason.LENGTH
    started = await service().start(serving_over(engine), spec(max_tokens=2), context())
    outputs = [e async for e in started.events() if isinstance(e, ChoiceOutput)]
    assert [o.closing for o in outputs] == [False, False]  # the fake finishes with no text


async def test_tool_calls_are_parts_never_text() -> None:
    engine = FakeEngineClient(pieces=["Sure. ", CALL[:20], CALL[20:]])
    tools = resolve_tools([ToolDefinition.model_validate(_tool("f"))], None, None)
    prompt = ChatPrompt([{"role": "user", "content": "call f"}], tools)
    started = await service().start(serving_over(engine, n_ctx=4096), spec(prompt), context())
    assert started.plan.calls_tools
    assert engine.requests[0].sampling.constraint is not None  # the calls' grammar
    result = await started.collect()
    (choice,) = result.choices
    calls = [p for p in choice.parts if isinstance(p, ToolCall)]
    assert [c.name for c in calls] == ["f"] and choice.num_tool_calls == 1
    assert "".join(p for p in choice.parts if isinstance(p, str)).strip() == "Sure."


async def test_a_json_output_that_fails_its_schema_is_never_a_clean_stop() -> None:
    engine = FakeEngineClient(pieces=['{"a": ', "1"])  # cut short, yet "stop"
    output = JsonOutput({"type": "object"}, "response_format")
    started = await service().start(serving_over(engine), spec(output=output), context())
    result = await started.collect()
    (choice,) = result.choices
    assert choice.structured is not None and not choice.structured.valid
    assert choice.finish_reason is FinishReason.ERROR


async def test_planning_errors_come_before_anything_is_queued() -> None:
    engine = FakeEngineClient()
    serving = serving_over(engine)
    with pytest.raises(InvalidRequest, match="empty"):
        await service().start(serving, spec(TokenPrompt([])), context())
    with pytest.raises(InvalidRequest, match="out of range"):
        await service().start(serving, spec(TokenPrompt([9999])), context())
    with pytest.raises(ContextLengthExceeded):
        await service().start(serving, spec(max_tokens=10_000), context())
    assert engine.requests == []


async def test_clamped_limits_fit_the_context() -> None:
    engine = FakeEngineClient()
    serving = serving_over(engine)
    planned = await service().plan(
        serving, spec(max_tokens=10_000, clamp_max_tokens=True, priority=Priority.LOW), context()
    )
    (choice,) = planned.choices
    request = choice.request
    assert len(request.prompt_token_ids) + request.sampling.max_tokens == serving.model_info.n_ctx
    assert request.priority is Priority.LOW


async def test_a_failed_choice_is_an_error_and_closing_early_aborts() -> None:
    engine = FakeEngineClient()
    engine.finish, engine.error = FinishReason.ERROR, "boom"
    started = await service().start(serving_over(engine), spec(), context())
    with pytest.raises(EngineError, match="boom"):
        await started.collect()
    hanging = FakeEngineClient(hang_after=1)
    started = await service().start(serving_over(hanging), spec(), context())
    events = started.events()
    assert isinstance(await anext(events), ChoiceOpened)
    await events.aclose()
    assert hanging.closed == [hanging.requests[0].request_id]


def _tool(name: str) -> dict[str, object]:
    parameters = {"type": "object", "properties": {"x": {"type": "integer"}}}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}
