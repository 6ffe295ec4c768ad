"""One OpenAI completion response made of n choices, each its own engine request.

Owns: planning the choices of a request (`build_choices`: prompt p's choice j gets index
p·n + j, its own seed, and its own `AddRequest`), submitting them together so they batch,
and assembling either one JSON body or one SSE stream in which chunks of different
choices interleave as they are produced, then the usage (prompt tokens counted once per
prompt, completion tokens summed over every choice). Does not own the choice shapes:
each route passes a `RendererFactory` (chat and completions differ).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from inferflux.api.errors import log_unexpected
from inferflux.api.openai.envelope import ChunkEnvelope, Usage
from inferflux.api.openai.generation import (
    CLIENT_CLOSED_REQUEST,
    DeltaStream,
    check_delta,
    check_token_ids,
    close_all,
    merge_deltas,
    resolve_max_tokens,
    submit_all,
    until_disconnect,
)
from inferflux.api.openai.logprobs import LogprobAligner, TokenEntry, TokenTexts
from inferflux.api.openai.protocol import GenerationRequest
from inferflux.api.sse import SSE_DONE, EventStreamResponse, sse_error
from inferflux.api.structured import OutputConstraint, structured_output_report
from inferflux.engine.messages import OPENAI_FINISH_REASON, AddRequest, RequestDelta
from inferflux.engine.protocol import EngineClient, ModelInfo
from inferflux.errors import EngineError, InferfluxError, InvalidRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of a response: its `index`, the prompt it continues, its engine request."""

    index: int
    prompt_index: int
    add: AddRequest


def build_choices(
    prefix: str,
    body: GenerationRequest,
    prompts: Sequence[list[int]],
    model_info: ModelInfo,
    prompt_param: str,
    constraint: str | None = None,
) -> tuple[str, list[Choice]]:
    """The response id and every choice of `body` over its tokenized `prompts`, each
    constrained by `constraint` (an llguidance grammar) when set.

    Raises InvalidRequest (empty prompt, logit_bias outside the vocabulary) and
    ContextLengthExceeded.
    """
    check_token_ids(list(body.logit_bias_ids()), model_info.n_vocab, "logit_bias")
    response_id = f"{prefix}-{uuid.uuid4().hex}"
    n = body.num_choices()
    choices = []
    for prompt_index, prompt_token_ids in enumerate(prompts):
        if not prompt_token_ids:
            raise InvalidRequest("the prompt is empty", param=prompt_param)
        max_tokens = resolve_max_tokens(
            len(prompt_token_ids), body.requested_max_tokens(), model_info.n_ctx, prompt_param
        )
        for j in range(n):
            index = prompt_index * n + j
            add = AddRequest(
                request_id=response_id if index == 0 else f"{response_id}-{index}",
                prompt_token_ids=prompt_token_ids,
                sampling=body.sampling_params(max_tokens, choice=j, constraint=constraint),
                priority=body.engine_priority(),
            )
            choices.append(Choice(index, prompt_index, add))
    return response_id, choices


class ChoiceRenderer(Protocol):
    """Renders one choice of one route as OpenAI dicts (chat and completions differ)."""

    def opening(self) -> dict[str, object] | None:
        """The choice's first streamed chunk (chat: the role), or None."""
        ...

    def piece(self, text: str, entries: list[TokenEntry]) -> dict[str, object]:
        """A streamed chunk: new text and the logprob entries released with it."""
        ...

    def finish(self, finish_reason: str) -> dict[str, object]:
        """The streamed chunk that ends the choice."""
        ...

    def final(self, text: str, entries: list[TokenEntry], finish_reason: str) -> dict[str, object]:
        """The whole choice of a non-streamed response."""
        ...


# (choice, its first delta) → renderer; the first delta carries prompt_logprobs.
RendererFactory = Callable[[Choice, RequestDelta], ChoiceRenderer]


@dataclass(slots=True)
class _Run:
    """One choice while it generates."""

    choice: Choice
    renderer: ChoiceRenderer
    aligner: LogprobAligner
    parts: list[str] = field(default_factory=list)
    entries: list[TokenEntry] = field(default_factory=list)
    last: RequestDelta | None = None

    def finish_reason(self) -> str:
        if self.last is None or self.last.finish_reason is None:
            raise EngineError("the engine ended the request without finishing it")
        return OPENAI_FINISH_REASON[self.last.finish_reason]


def usage_of(runs: Sequence[_Run]) -> Usage:
    """Usage of a response: each prompt once (its cached tokens: the fewest any of its
    choices had), completion tokens over every choice."""
    by_prompt: dict[int, list[_Run]] = {}
    for run in runs:
        by_prompt.setdefault(run.choice.prompt_index, []).append(run)
    prompt_tokens = sum(len(rs[0].choice.add.prompt_token_ids) for rs in by_prompt.values())
    cached = sum(
        min(r.last.num_cached_tokens if r.last else 0 for r in rs) for rs in by_prompt.values()
    )
    completion = sum(r.last.num_output_tokens if r.last else 0 for r in runs)
    return Usage(prompt_tokens, completion, cached)


class Responder:
    """Runs the choices of one request and answers: a JSON body or an SSE stream."""

    def __init__(
        self,
        envelope: ChunkEnvelope,
        choices: list[Choice],
        texts: TokenTexts,
        make_renderer: RendererFactory,
        output: OutputConstraint | None = None,
    ) -> None:
        """`output`: the structured-output constraint, whose check each finished choice
        reports as `structured_output` (api/structured.py)."""
        self.envelope = envelope
        self.choices = choices
        self.texts = texts
        self.make_renderer = make_renderer
        self.output = output

    async def respond(self, request: Request, engine: EngineClient, *, stream: bool) -> Response:
        """Submit every choice, then stream or collect them. Errors before the first
        token (503, 408, 4xx) are raised and rendered by the app's error handlers."""
        started = time.monotonic()
        adds = [choice.add for choice in self.choices]
        streams = await until_disconnect(request, submit_all(engine, adds))
        if streams is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        logger.debug(
            "%s started: %d choices, first deltas after %.3f s",
            self.envelope.response_id,
            len(streams),
            time.monotonic() - started,
        )
        try:
            runs = [self._run(c, s) for c, s in zip(self.choices, streams, strict=True)]
        except BaseException:
            await close_all(streams)
            raise
        if stream:
            return EventStreamResponse(self._events(streams, runs))
        body = await until_disconnect(request, self._collect(streams, runs))
        if body is None:
            await close_all(streams)
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return Response(msgspec.json.encode(body), media_type="application/json")

    def _run(self, choice: Choice, stream: DeltaStream) -> _Run:
        first = stream.first_delta
        if first is None:
            raise EngineError("the engine sent nothing for the request")
        renderer = self.make_renderer(choice, first)
        enabled = choice.add.sampling.logprobs is not None
        return _Run(choice, renderer, LogprobAligner(self.texts, enabled=enabled))

    async def _collect(self, streams: list[DeltaStream], runs: list[_Run]) -> dict[str, object]:
        """The whole response body. Raises EngineError / QueueTimeout if a choice failed."""
        async with contextlib.aclosing(merge_deltas(streams)) as deltas:
            async for index, delta in deltas:
                check_delta(delta)
                run = runs[index]
                run.entries.extend(run.aligner.push(delta))
                run.parts.append(delta.text)
                if delta.finish_reason is not None:
                    run.last = delta
        choices = [self._final(run) for run in runs]
        return self.envelope.full_response(choices, usage_of(runs))

    def _final(self, run: _Run) -> dict[str, object]:
        finish_reason, extra = self._outcome(run)
        return {**run.renderer.final("".join(run.parts), run.entries, finish_reason), **extra}

    def _outcome(self, run: _Run) -> tuple[str, dict[str, object]]:
        """A finished choice's finish_reason and extra fields: `structured_output` when
        its output must be JSON (api/structured.py)."""
        finish_reason = run.finish_reason()
        if not self._checks_json:
            return finish_reason, {}
        assert self.output is not None
        report, finish_reason = structured_output_report(
            self.output, "".join(run.parts), finish_reason
        )
        return finish_reason, {"structured_output": report}

    @property
    def _checks_json(self) -> bool:
        return self.output is not None and self.output.validate is not None

    async def _events(
        self, streams: list[DeltaStream], runs: list[_Run]
    ) -> AsyncGenerator[bytes, None]:
        """SSE events, ending with `data: [DONE]`; a failure becomes an error event (and
        ends every choice)."""
        deltas = merge_deltas(streams)
        try:
            for run in runs:
                opening = run.renderer.opening()
                if opening is not None:
                    yield self.envelope.chunk([opening])
            async for index, delta in deltas:
                for event in self._delta_events(runs[index], delta):
                    yield event
            if self.envelope.include_usage:
                yield self.envelope.usage(usage_of(runs))
        except InferfluxError as exc:
            yield sse_error(exc)
        except Exception as exc:
            log_unexpected(exc, "an event stream")
            yield sse_error(InferfluxError("internal server error; the failure was logged"))
        finally:
            await deltas.aclose()
            await close_all(streams)
        yield SSE_DONE

    def _delta_events(self, run: _Run, delta: RequestDelta) -> list[bytes]:
        check_delta(delta)
        events = []
        entries = run.aligner.push(delta)
        if delta.text or entries:
            events.append(self.envelope.chunk([run.renderer.piece(delta.text, entries)]))
            if self._checks_json:
                run.parts.append(delta.text)
        if delta.finish_reason is not None:
            run.last = delta
            finish_reason, extra = self._outcome(run)
            events.append(self.envelope.chunk([{**run.renderer.finish(finish_reason), **extra}]))
        return events
