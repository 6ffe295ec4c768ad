"""Reading submitted requests: `DeltaStream` (one request's deltas), `submit_all` (n
requests at once, so the engine batches them), `merge_deltas` (their deltas interleaved
as they arrive) and `check_delta` (a delta that ends its request badly, as an error).

Cancellation: every path that stops early closes the engine's iterators, which aborts
the requests in the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import anyio

from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta
from inferflux.errors import (
    ConstraintFailed,
    ContextLengthExceeded,
    EngineError,
    InferfluxError,
    InvalidRequest,
    KvCacheFull,
    QueueTimeout,
)
from inferflux.models.serving import ServedEngine
from inferflux.security.context import RequestContext


class DeltaStream:
    """The deltas of one submitted request, the first one already received.

    Iterate it once; it stops after the delta that carries a finish_reason. `aclose()`
    must be called in every case (it aborts the request unless it finished).
    """

    def __init__(
        self, engine: ServedEngine, request_id: str, deltas: AsyncIterator[RequestDelta]
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

    async def abort(self) -> None:
        """Abort the request in the engine unless it finished; the stream stays open and
        gets the request's ABORT delta (graceful shutdown's cut)."""
        if not self._done:
            await self._engine.abort(self._request_id)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if isinstance(self._deltas, AsyncGenerator):
                await self._deltas.aclose()  # the engine aborts an unfinished request
            elif not self._done:
                await self._engine.abort(self._request_id)


async def submit_all(
    engine: ServedEngine, requests: Sequence[AddRequest], context: RequestContext
) -> list[DeltaStream]:
    """Submit every request at once (so the engine batches them) and wait for each first
    delta. Raises the first failure (closing every stream): NoWorkerReady / QueueFull
    (503), QueueTimeout (408), EngineError when a request failed before it produced
    anything."""
    streams = [DeltaStream(engine, r.request_id, engine.generate(r, context)) for r in requests]
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
        if delta.error_code == ConstraintFailed.code:
            raise ConstraintFailed(delta.error or "the output constraint failed")
        if delta.error_code == KvCacheFull.code:
            raise KvCacheFull(f"{delta.error or 'no KV cache room'}; retry later")
        if delta.error_code == InvalidRequest.code:  # e.g. an image the worker cannot use
            raise InvalidRequest(delta.error or "the request cannot be run")
        if delta.error_code == ContextLengthExceeded.code:  # known only after its images
            raise ContextLengthExceeded(delta.error or "the prompt is over the context")
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
