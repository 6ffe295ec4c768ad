"""Driving generations through the engine, shared by the OpenAI and native routes.

Owns: the checks that need the model (model id, vocabulary, context length, the output
constraint),
tokenizing prompts, submitting requests, and reading their `RequestDelta`s: `DeltaStream`
(one request), `submit_all` (n requests at once, so the engine batches them) and
`merge_deltas` (their deltas interleaved as they arrive). Does not own: OpenAI response
shapes (`responder.py`, `chat.py`, `completions.py`) or request parsing (`protocol.py`).

Cancellation: every path that stops early closes the engine's iterators, which aborts
the requests in the engine. A client that disconnects while we wait (before the first
token, or during a non-streaming request) cancels the wait (`until_disconnect`); during a
stream, `EventStreamResponse` does the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from functools import partial
from typing import TypeVar

import anyio
from starlette.requests import Request

from inferflux.api.openai.protocol import GenerationRequest, JsonObjectFormat, JsonSchemaFormat
from inferflux.api.structured import OutputConstraint, grammar_constraint, schema_constraint
from inferflux.api.telemetry import tokenize_span
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer
from inferflux.errors import (
    ContextLengthExceeded,
    EngineError,
    InferfluxError,
    InvalidRequest,
    ModelNotFound,
    QueueTimeout,
)
from inferflux.security.rbac import authorize_model

T = TypeVar("T")
_THREAD_TOKENIZE_CHARS = 16_384  # longer texts are tokenized off the event loop
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"


def check_model(requested: str | None, model_info: ModelInfo) -> str:
    """The model id to answer with (an alias answers with the id); raises ModelNotFound
    for a name that is not this model's (the route's `serving_for` already resolved it)
    and PermissionDenied for one outside the caller's `allowed_models`."""
    if model_info.serves(requested) or model_info.serves((requested or "").removesuffix(":latest")):
        authorize_model(*model_info.access_names())
        return model_info.model_id
    raise ModelNotFound(
        f"the model '{requested}' does not exist on this server (GET /v1/models lists the models)",
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
    with tokenize_span(len(text)):
        if len(text) > _THREAD_TOKENIZE_CHARS:
            return await anyio.to_thread.run_sync(run)
        return run()


async def output_constraint(
    body: GenerationRequest, compiler: ConstraintCompiler
) -> OutputConstraint | None:
    """The constraint `response_format` (json_object / json_schema) or `grammar` asks for,
    compiled; None when the output is free. Raises InvalidRequest (400) for both at once
    or for a schema or grammar that is invalid, too large, or cannot be enforced."""
    fmt = body.response_format
    json_format = isinstance(fmt, JsonObjectFormat | JsonSchemaFormat)
    if body.grammar is not None:
        if json_format:
            raise InvalidRequest(
                "send either `grammar` or a JSON `response_format`, not both", param="grammar"
            )
        return await grammar_constraint(
            compiler, body.grammar, body.grammar_syntax or "gbnf", "grammar"
        )
    if body.grammar_syntax is not None:
        raise InvalidRequest("grammar_syntax needs a grammar", param="grammar_syntax")
    if isinstance(fmt, JsonSchemaFormat):
        param = "response_format.json_schema.schema"
        return await schema_constraint(compiler, fmt.json_schema.schema_, param)
    if isinstance(fmt, JsonObjectFormat):
        return await schema_constraint(compiler, fmt.schema_, "response_format.schema")
    return None


async def tokenize_chat(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: list[dict[str, object]],
    *,
    add_generation_prompt: bool = True,
    add_special: bool | None = None,
    tools: list[dict[str, object]] | None = None,
) -> list[int]:
    """Token ids of `messages` rendered by the chat template (with `tools`, for templates
    that render tools themselves). By default BOS is added unless the rendered text
    already starts with it (`add_special` overrides)."""
    text = template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    if add_special is None:
        bos = tokenizer.bos_text
        add_special = not (bos and text.startswith(bos))
    return await tokenize(tokenizer, text, add_special=add_special)


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

    @property
    def first_delta(self) -> RequestDelta | None:
        """The first delta while it has not been iterated yet (None before `start`)."""
        return self._first

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


async def submit_all(engine: EngineClient, requests: Sequence[AddRequest]) -> list[DeltaStream]:
    """Submit every request at once (so the engine batches them) and wait for each first
    delta. Raises the first failure (closing every stream): NoWorkerReady / QueueFull
    (503), QueueTimeout (408), EngineError when a request failed before it produced
    anything."""
    streams = [DeltaStream(engine, r.request_id, engine.generate(r)) for r in requests]
    try:
        if len(streams) == 1:
            await streams[0].start()
        else:
            async with anyio.create_task_group() as task_group:
                for stream in streams:
                    task_group.start_soon(stream.start)
        for stream in streams:
            if stream.first_delta is not None:
                check_delta(stream.first_delta)
    except BaseExceptionGroup as group:
        await close_all(streams)
        raise _first_error(group) from None
    except BaseException:
        await close_all(streams)
        raise
    return streams


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error to report for a group: the first InferfluxError, else the first one."""
    errors: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        error = pending.pop(0)
        if isinstance(error, BaseExceptionGroup):
            pending[:0] = list(error.exceptions)
        else:
            errors.append(error)
    return next((e for e in errors if isinstance(e, InferfluxError)), errors[0])


async def close_all(streams: Sequence[DeltaStream]) -> None:
    """Close every stream (each aborts its request unless it finished)."""
    for stream in streams:
        await stream.aclose()


def check_delta(delta: RequestDelta) -> None:
    """Raise for a delta that ends its request badly: EngineError (it failed in the
    engine) or QueueTimeout (it waited too long and never ran: 408)."""
    if delta.finish_reason is FinishReason.ERROR:
        raise EngineError(f"generation failed in the engine: {delta.error or 'unknown error'}")
    if delta.finish_reason is FinishReason.TIMEOUT:
        raise QueueTimeout(
            "the request waited in the queue longer than scheduler.queue_timeout_s and never "
            "ran; retry later"
        )


async def merge_deltas(
    streams: Sequence[DeltaStream],
) -> AsyncGenerator[tuple[int, RequestDelta], None]:
    """Every stream's deltas as they arrive, as (position in `streams`, delta), until all
    finished. Raises the first failure of any stream. Closing the generator (or any
    failure) closes every stream."""
    if len(streams) == 1:
        try:
            async for delta in streams[0]:
                yield 0, delta
        finally:
            await close_all(streams)
        return
    queue: asyncio.Queue[tuple[int, RequestDelta | Exception | None]] = asyncio.Queue()
    tasks = [
        asyncio.create_task(_pump(index, stream, queue), name=f"deltas-{index}")
        for index, stream in enumerate(streams)
    ]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        with anyio.CancelScope(shield=True):
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await close_all(streams)


async def _pump(
    index: int,
    stream: DeltaStream,
    queue: asyncio.Queue[tuple[int, RequestDelta | Exception | None]],
) -> None:
    """Move one stream's deltas into `queue`; then None, or the exception that ended it."""
    try:
        async for delta in stream:
            queue.put_nowait((index, delta))
    except Exception as exc:  # NOTE: handed to the consumer, which raises it
        queue.put_nowait((index, exc))
    else:
        queue.put_nowait((index, None))


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
