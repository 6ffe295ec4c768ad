"""`GenerationService`: every generation and embedding, whichever frontend asked for it.

A dialect (OpenAI, Ollama, native; over HTTP, SSE, WebSocket or gRPC) translates its
request into a `GenerationSpec` and hands it over with the model it leased and the
request's `RequestContext`; the service plans it (planner.py), submits every choice at
once so the engine batches them, waits for each first delta (so a refusal, 503 / 408 /
4xx, is raised before anything is sent), and returns a `Generation`: typed events to
stream (events.py), or the whole result to collect. The service owns what every dialect
used to repeat: logprob alignment, tool-call parsing, the structured-output check,
usage and timings, closing the engine's streams (which aborts unfinished requests) and
turning a failed delta into an error. It is the only part of the API that talks to a
model's engine (an import contract keeps it so).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator

from inferflux.api.drain import Drain
from inferflux.api.generation.events import (
    ChoiceClosed,
    ChoiceOpened,
    ChoiceOutput,
    ChoiceResult,
    GenerationDone,
    GenerationEvent,
    GenerationResult,
    Part,
    StructuredCheck,
    Timings,
    Usage,
)
from inferflux.api.generation.logprobs import LogprobAligner, TokenEntry, TokenTexts, prompt_entries
from inferflux.api.generation.planner import Choice, GenerationPlan, Planner
from inferflux.api.generation.spec import GenerationSpec
from inferflux.api.generation.streams import DeltaStream, check_delta, close_all, merge_deltas
from inferflux.api.generation.streams import submit_all as _submit_all
from inferflux.api.telemetry import Telemetry
from inferflux.api.tools import ToolCall, ToolCallParser
from inferflux.engine.messages import FinishReason, RequestDelta
from inferflux.engine.protocol import EmbeddingResult
from inferflux.errors import EngineError
from inferflux.models.serving import ServingState
from inferflux.security.context import RequestContext

_NO_ENTRIES: list[TokenEntry] = []  # NOTE: shared, never mutated


class ChoiceRun:
    """One choice while it generates: alignment, parsing, counts, and (when `keep`) its
    whole output."""

    def __init__(self, choice: Choice, texts: TokenTexts, plan: GenerationPlan, keep: bool):
        self.choice = choice
        sampling = choice.request.sampling
        self.logprobs = sampling.logprobs is not None
        self.aligner = LogprobAligner(texts, enabled=self.logprobs)
        tools = plan.tools
        self.parser = None
        if tools is not None and tools.plan is not None:
            self.parser = ToolCallParser(tools.tool_format, tools.plan.names())
        self.output = plan.output if plan.output and plan.output.validate else None
        self.keep = keep
        self.texts: list[str] = []  # the raw text, when kept or checked
        self.parts: list[Part] = []
        self.entries: list[TokenEntry] = []
        self.token_ids: list[int] = []
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.num_engine_prompt_tokens = 0  # the prompt as the worker ran it (with images)
        self.draft = (0, 0)  # speculative decoding: drafted, accepted
        self.first_token_ns: int | None = None
        self.stop_sequence: str | None = None
        self.last_delta_ns = 0
        self.result: ChoiceResult | None = None

    def feed(self, delta: RequestDelta) -> tuple[GenerationEvent, ...]:
        """The events of one delta (none, an output, a close, or both). Raises
        EngineError / QueueTimeout for a delta that ends the choice badly.

        NOTE: this runs once per streamed token; keep it to attribute reads and appends.
        """
        finish = delta.finish_reason
        if finish is not None:
            check_delta(delta)
            self.stop_sequence = delta.stop_sequence
            self.draft = (delta.num_draft_tokens, delta.num_draft_accepted)  # totals
            self.num_engine_prompt_tokens = delta.num_prompt_tokens  # with images' tokens
        text = delta.text
        self.last_delta_ns = now = time.monotonic_ns()
        if delta.token_ids:
            self.token_ids.extend(delta.token_ids)
            if self.first_token_ns is None:
                self.first_token_ns = now
        elif text and self.first_token_ns is None:
            self.first_token_ns = now
        if delta.num_output_tokens > self.num_output_tokens:
            self.num_output_tokens = delta.num_output_tokens
        if delta.num_cached_tokens > self.num_cached_tokens:
            self.num_cached_tokens = delta.num_cached_tokens
        entries = self.aligner.push(delta) if self.logprobs else _NO_ENTRIES
        if self.keep or self.output is not None:
            self.texts.append(text)
        if not (text or entries):
            return () if finish is None else (self._close(finish),)
        parser = self.parser
        parts: list[Part] = [text] if parser is None else parser.push(text)
        if self.keep:
            self.parts.extend(parts)
            self.entries.extend(entries)
        output = ChoiceOutput(self.choice.index, parts, entries, finish is not None)
        return (output,) if finish is None else (output, self._close(finish))

    def _close(self, finish_reason: FinishReason) -> ChoiceClosed:
        rest: list[Part] = self.parser.finish() if self.parser is not None else []
        structured = None
        if self.output is not None:
            error = self.output.check("".join(self.texts))
            structured = StructuredCheck(error is None, error)
            if error is not None and finish_reason is not FinishReason.LENGTH:
                finish_reason = FinishReason.ERROR  # never passed off as a complete answer
        if self.keep:
            self.parts.extend(rest)
        self.result = ChoiceResult(
            choice=self.choice,
            finish_reason=finish_reason,
            num_output_tokens=self.num_output_tokens,
            num_cached_tokens=self.num_cached_tokens,
            output_token_ids=self.token_ids,
            num_tool_calls=self.parser.num_calls if self.parser is not None else 0,
            text="".join(self.texts) if self.keep else "",
            parts=self.parts,
            logprobs=self.entries,
            structured=structured,
            stop_sequence=self.stop_sequence,
            num_draft_tokens=self.draft[0],
            num_draft_accepted=self.draft[1],
            num_engine_prompt_tokens=self.num_engine_prompt_tokens,
        )
        return ChoiceClosed(rest, self.result)


class Generation:
    """A submitted request whose choices all answered. Read it once: `events()` (to
    stream) or `collect()`; `aclose()` aborts whatever has not finished (both readers
    close it themselves when they end, however they end)."""

    def __init__(
        self,
        plan: GenerationPlan,
        streams: list[DeltaStream],
        texts: TokenTexts,
        opened: list[ChoiceOpened],
        clock: tuple[int, int, int],
    ) -> None:
        self.plan = plan
        self.opened = opened
        self._streams = streams
        self._texts = texts
        self._started_ns, self._submitted_ns, self._first_delta_ns = clock
        self._cut = False

    @property
    def response_id(self) -> str:
        return self.plan.response_id

    async def events(self) -> AsyncGenerator[GenerationEvent, None]:
        """Every event, in order (module docstring of events.py); raises EngineError /
        QueueTimeout when a choice fails (the caller reports it mid-stream). Closing the
        generator early aborts every unfinished choice."""
        runs = self._runs(keep=False)
        try:
            for opened in self.opened:
                yield opened
            if len(runs) == 1:  # NOTE: no merging layer on the one-choice path
                feed = runs[0].feed
                async for delta in self._streams[0]:
                    for event in feed(delta):
                        yield event
            else:
                async with contextlib.aclosing(merge_deltas(self._streams)) as deltas:
                    async for index, delta in deltas:
                        for event in runs[index].feed(delta):
                            yield event
            yield GenerationDone(self._result(runs))
        finally:
            await close_all(self._streams)

    async def collect(self) -> GenerationResult:
        """The whole generation (every choice's text, parts and logprobs kept). Raises
        EngineError / QueueTimeout when a choice failed."""
        runs = self._runs(keep=True)
        try:
            async with contextlib.aclosing(merge_deltas(self._streams)) as deltas:
                async for index, delta in deltas:
                    runs[index].feed(delta)
        finally:
            await close_all(self._streams)
        return self._result(runs)

    async def aclose(self) -> None:
        await close_all(self._streams)

    @property
    def cut(self) -> bool:
        """True once `abort` ran (the server's shutdown grace ran out): the reader ends
        the generation as ShuttingDown, not as a normal end."""
        return self._cut

    async def abort(self) -> None:
        """Abort every unfinished choice in the engine, leaving the streams open: each
        then gets its ABORT delta, so a reader blocked on the next delta wakes up."""
        self._cut = True
        for stream in self._streams:
            await stream.abort()

    def _runs(self, *, keep: bool) -> list[ChoiceRun]:
        return [ChoiceRun(choice, self._texts, self.plan, keep) for choice in self.plan.choices]

    def _result(self, runs: list[ChoiceRun]) -> GenerationResult:
        results = []
        for run in runs:
            if run.result is None:
                raise EngineError("the engine ended the request without finishing it")
            results.append(run.result)
        firsts = [run.first_token_ns for run in runs if run.first_token_ns is not None]
        timings = Timings(
            self._started_ns,
            self._submitted_ns,
            self._first_delta_ns,
            min(firsts) if firsts else None,
            max(run.last_delta_ns for run in runs),
        )
        return GenerationResult(self.plan.response_id, results, usage_of(results), timings)


def usage_of(results: list[ChoiceResult]) -> Usage:
    """Each prompt once (its cached tokens: the fewest any of its choices had), completion
    tokens over every choice."""
    by_prompt: dict[int, list[ChoiceResult]] = {}
    for result in results:
        by_prompt.setdefault(result.choice.prompt_index, []).append(result)
    prompt_tokens = sum(rs[0].num_prompt_tokens for rs in by_prompt.values())
    cached = sum(min(r.num_cached_tokens for r in rs) for rs in by_prompt.values())
    completion = sum(r.num_output_tokens for r in results)
    drafted = sum(r.num_draft_tokens for r in results)
    accepted = sum(r.num_draft_accepted for r in results)
    return Usage(prompt_tokens, completion, cached, drafted, accepted)


class GenerationService:
    """Plans, submits and reads generations; runs embeddings. Stateless between requests
    but for the live generations its `drain` can cut at shutdown; one per app
    (`AppState.generation`)."""

    def __init__(self, telemetry: Telemetry, drain: Drain | None = None) -> None:
        self._telemetry = telemetry
        self.drain = drain or Drain()  # graceful shutdown: cuts live generations

    async def plan(
        self, serving: ServingState, spec: GenerationSpec, context: RequestContext
    ) -> GenerationPlan:
        """`spec` planned over the leased model (planner.py); nothing is submitted. The
        images' SHA-256s go to the request's record (the audit event lists them)."""
        planner = Planner(serving, self._telemetry.tracer, self._telemetry.metrics)
        plan = await planner.plan(spec)
        for choice in plan.choices:
            for image in choice.request.images:
                if image.sha256 not in context.record.image_sha256s:
                    context.record.image_sha256s.append(image.sha256)
        return plan

    async def start(
        self, serving: ServingState, spec: GenerationSpec, context: RequestContext
    ) -> Generation:
        """Plan `spec`, submit every choice and wait for each first delta. Raises what
        planning raises, NoWorkerReady / QueueFull (503), QueueTimeout (408), RateLimited
        (429), the guardrails' refusals, EngineError."""
        started_ns = time.monotonic_ns()
        plan = await self.plan(serving, spec, context)
        return await self.submit(serving, plan, context, started_ns=started_ns)

    async def submit(
        self,
        serving: ServingState,
        plan: GenerationPlan,
        context: RequestContext,
        *,
        started_ns: int | None = None,
    ) -> Generation:
        """Submit a planned request (see `start`)."""
        submitted_ns = time.monotonic_ns()
        requests = [choice.request for choice in plan.choices]
        streams = await _submit_all(serving.engine, requests, context)
        first_delta_ns = time.monotonic_ns()
        texts = TokenTexts(serving.tokenizer)
        try:
            opened = [_opened(choice, stream, texts) for choice, stream in zip(
                plan.choices, streams, strict=True
            )]  # fmt: skip
        except BaseException:
            await close_all(streams)
            raise
        clock = (started_ns or submitted_ns, submitted_ns, first_delta_ns)
        generation = Generation(plan, streams, texts, opened, clock)
        self.drain.track(generation)
        return generation

    async def embed(
        self,
        serving: ServingState,
        inputs: list[list[int]],
        context: RequestContext,
        *,
        normalize: bool = True,
    ) -> EmbeddingResult:
        """One pooled vector per token list (the engine's `embed`, under the request's
        security policy and token limits)."""
        return await serving.engine.embed(inputs, context, normalize=normalize)


def _opened(choice: Choice, stream: DeltaStream, texts: TokenTexts) -> ChoiceOpened:
    first = stream.first_delta
    if first is None:
        raise EngineError("the engine sent nothing for the request")
    if choice.request.sampling.prompt_logprobs is None:
        return ChoiceOpened(choice)
    return ChoiceOpened(choice, prompt_entries(texts, choice.request.prompt_token_ids, first))


__all__ = ["ChoiceRun", "Generation", "GenerationService", "ToolCall", "usage_of"]
