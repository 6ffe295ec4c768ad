"""Driving one generation through the engine, shared by chat and text completions.

Owns: the checks that need the model (model id, vocabulary, context length), building the
`AddRequest`, submitting it, and turning its `RequestDelta`s into either one JSON response
or an SSE stream. Does not own: the OpenAI chunk shapes (each route passes a
`ChunkFormatter`) or request parsing (`protocol.py`).

Cancellation: every path that stops early closes the engine's iterator, which aborts the
request in the engine. A client that disconnects while we wait (before the first token, or
during a non-streaming request) cancels the wait (`until_disconnect`); during a stream,
`EventStreamResponse` does the same.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from inferflux.api.errors import log_unexpected
from inferflux.api.openai.protocol import GenerationRequest
from inferflux.api.sse import SSE_DONE, EventStreamResponse, sse_data, sse_error
from inferflux.engine.messages import OPENAI_FINISH_REASON, AddRequest, FinishReason, RequestDelta
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer
from inferflux.errors import (
    ContextLengthExceeded,
    EngineError,
    InferfluxError,
    InvalidRequest,
    ModelNotFound,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
_THREAD_TOKENIZE_CHARS = 16_384  # longer texts are tokenized off the event loop
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True, slots=True)
class Completed:
    """A finished non-streaming generation."""

    text: str
    finish_reason: str  # OpenAI's name
    usage: Usage


class ChunkEnvelope:
    """The fields every body and SSE chunk of one request share, and the usage chunk.

    Subclasses set `chunk_object` and `response_object` and build their own choices.
    """

    chunk_object = ""
    response_object = ""

    def __init__(
        self, request_id: str, model: str, system_fingerprint: str, *, include_usage: bool
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.system_fingerprint = system_fingerprint
        self.include_usage = include_usage
        self.created = int(time.time())

    def body(self, choices: list[dict[str, object]], object_name: str) -> dict[str, object]:
        return {
            "id": self.request_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        }

    def chunk(self, choices: list[dict[str, object]]) -> bytes:
        """One SSE event; `usage: null` when the client asked for a usage chunk at the end."""
        event = self.body(choices, self.chunk_object)
        if self.include_usage:
            event["usage"] = None
        return sse_data(event)

    def usage(self, usage: Usage) -> bytes:
        """The final usage event: empty choices (OpenAI's `stream_options.include_usage`)."""
        return sse_data({**self.body([], self.chunk_object), "usage": usage.as_dict()})

    def full_response(self, choice: dict[str, object], usage: Usage) -> dict[str, object]:
        return {**self.body([choice], self.response_object), "usage": usage.as_dict()}


class ChunkFormatter(Protocol):
    """Encodes one route's SSE events (chat and text completions differ)."""

    def opening(self) -> bytes | None: ...

    def text(self, text: str) -> bytes: ...

    def finish(self, finish_reason: str) -> bytes: ...

    def usage(self, usage: Usage) -> bytes: ...


def check_model(requested: str | None, model_info: ModelInfo) -> str:
    """The model id to answer with; raises ModelNotFound for a model we do not serve."""
    if requested is None or requested == model_info.model_id:
        return model_info.model_id
    raise ModelNotFound(
        f"the model '{requested}' does not exist on this server; it serves "
        f"'{model_info.model_id}' (GET /v1/models)",
        param="model",
    )


def check_token_ids(token_ids: list[int], n_vocab: int, param: str) -> None:
    for token_id in token_ids:
        if not 0 <= token_id < n_vocab:
            raise InvalidRequest(
                f"token id {token_id} is out of range: the vocabulary has {n_vocab} tokens",
                param=param,
            )


def resolve_max_tokens(
    num_prompt_tokens: int, requested: int | None, n_ctx: int, param: str
) -> int:
    """`requested`, or whatever the context leaves; raises ContextLengthExceeded."""
    max_tokens = requested if requested is not None else n_ctx - num_prompt_tokens
    if max_tokens < 1 or num_prompt_tokens + max_tokens > n_ctx:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {n_ctx} tokens, but {num_prompt_tokens} "
            f"prompt tokens + {max(max_tokens, 1)} completion tokens were requested; shorten "
            "the prompt or lower max_tokens",
            param=param,
        )
    return max_tokens


async def tokenize(tokenizer: Tokenizer, text: str, *, add_special: bool) -> list[int]:
    """Token ids of `text` (special tokens parsed); long texts run on a worker thread."""
    run = partial(tokenizer.tokenize, text, add_special=add_special, parse_special=True)
    if len(text) > _THREAD_TOKENIZE_CHARS:
        return await anyio.to_thread.run_sync(run)
    return run()


def build_request(
    prefix: str,
    body: GenerationRequest,
    prompt_token_ids: list[int],
    model_info: ModelInfo,
    prompt_param: str,
) -> AddRequest:
    """The engine request for a validated body and its tokenized prompt."""
    if not prompt_token_ids:
        raise InvalidRequest("the prompt is empty", param=prompt_param)
    check_token_ids(list(body.logit_bias_ids()), model_info.n_vocab, "logit_bias")
    max_tokens = resolve_max_tokens(
        len(prompt_token_ids), body.requested_max_tokens(), model_info.n_ctx, prompt_param
    )
    return AddRequest(
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        prompt_token_ids=prompt_token_ids,
        sampling=body.sampling_params(max_tokens),
    )


class DeltaStream:
    """The deltas of one submitted request, the first one already received.

    Iterate it once; it stops after the delta that carries a finish_reason. `aclose()`
    must be called in every case (it aborts the request unless it finished).
    """

    def __init__(
        self, engine: EngineClient, request_id: str, deltas: AsyncIterator[RequestDelta]
    ) -> None:
        self._engine = engine
        self._request_id = request_id
        self._deltas = deltas
        self._first: RequestDelta | None = None
        self._done = False

    async def start(self) -> None:
        """Wait for the first delta; raises NoWorkerReady (503) when no worker takes it."""
        self._first = await self._next()

    def __aiter__(self) -> DeltaStream:
        return self

    async def __anext__(self) -> RequestDelta:
        if self._done:
            raise StopAsyncIteration
        if self._first is not None:
            delta, self._first = self._first, None
        else:
            delta = await self._next()
        self._done = delta.finish_reason is not None
        return delta

    async def _next(self) -> RequestDelta:
        try:
            return await anext(self._deltas)
        except StopAsyncIteration:
            self._done = True
            raise EngineError("the engine ended the request without finishing it") from None

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if isinstance(self._deltas, AsyncGenerator):
                await self._deltas.aclose()  # the engine aborts an unfinished request
            elif not self._done:
                await self._engine.abort(self._request_id)


async def submit(engine: EngineClient, request: AddRequest) -> DeltaStream:
    """Submit `request` and wait for its first delta (closing it again if that fails)."""
    stream = DeltaStream(engine, request.request_id, engine.generate(request))
    try:
        await stream.start()
    except BaseException:
        await stream.aclose()
        raise
    return stream


async def collect(stream: DeltaStream, num_prompt_tokens: int) -> Completed:
    """Read the whole generation. Raises EngineError if it failed in the engine."""
    parts: list[str] = []
    last: RequestDelta | None = None
    try:
        async for delta in stream:
            parts.append(delta.text)
            last = delta
    finally:
        await stream.aclose()
    if last is None or last.finish_reason is None:
        raise EngineError("the engine ended the request without finishing it")
    if last.finish_reason is FinishReason.ERROR:
        raise EngineError(f"generation failed in the engine: {last.error or 'unknown error'}")
    usage = Usage(num_prompt_tokens, last.num_output_tokens)
    return Completed("".join(parts), OPENAI_FINISH_REASON[last.finish_reason], usage)


async def stream_events(
    stream: DeltaStream, chunks: ChunkFormatter, *, include_usage: bool, num_prompt_tokens: int
) -> AsyncGenerator[bytes, None]:
    """SSE events of a generation, ending with `data: [DONE]`; failures become an error event."""
    try:
        opening = chunks.opening()
        if opening is not None:
            yield opening
        async for delta in stream:
            if delta.text:
                yield chunks.text(delta.text)
            if delta.finish_reason is FinishReason.ERROR:
                message = f"generation failed in the engine: {delta.error or 'unknown error'}"
                yield sse_error(EngineError(message))
            elif delta.finish_reason is not None:
                yield chunks.finish(OPENAI_FINISH_REASON[delta.finish_reason])
                if include_usage:
                    yield chunks.usage(Usage(num_prompt_tokens, delta.num_output_tokens))
    except InferfluxError as exc:
        yield sse_error(exc)
    except Exception as exc:
        log_unexpected(exc, "an event stream")
        yield sse_error(InferfluxError("internal server error; the failure was logged"))
    finally:
        await stream.aclose()
    yield SSE_DONE


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T | None:
    """Await `awaitable`, or cancel it and return None if the client disconnects first."""
    result: list[T] = []
    try:
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(_cancel_on_disconnect, request, task_group.cancel_scope)
            result.append(await awaitable)
            task_group.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return result[0] if result else None


async def _cancel_on_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def respond(
    request: Request,
    engine: EngineClient,
    add: AddRequest,
    chunks: ChunkFormatter,
    *,
    stream: bool,
    include_usage: bool,
    build: Callable[[Completed], dict[str, object]],
) -> Response:
    """Run `add` and answer: an SSE stream, or one JSON body made by `build`."""
    num_prompt_tokens = len(add.prompt_token_ids)
    started = time.monotonic()
    deltas = await until_disconnect(request, submit(engine, add))
    if deltas is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    logger.debug(
        "%s started: %d prompt tokens, first delta after %.3f s",
        add.request_id,
        num_prompt_tokens,
        time.monotonic() - started,
    )
    if stream:
        events = stream_events(
            deltas, chunks, include_usage=include_usage, num_prompt_tokens=num_prompt_tokens
        )
        return EventStreamResponse(events)
    completed = await until_disconnect(request, collect(deltas, num_prompt_tokens))
    if completed is None:
        await deltas.aclose()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return Response(msgspec.json.encode(build(completed)), media_type="application/json")
