"""A generation over HTTP: one JSON body, or a stream of frames (SSE or NDJSON).

Owns: `respond` (start the generation, then stream or collect it; a client that goes
away while we wait gets nginx's 499 and its requests are aborted), `until_disconnect`,
`embed_or_disconnect`,
and the `Renderer` protocol each dialect implements: its frames for every event, for a
failure after the stream started, and for the end; its body for a collected result. A
failure before the first frame (503, 408, 4xx) is raised and rendered by the app's error
handlers, in the dialect's error shape.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response

from inferflux.api.drain import CUT
from inferflux.api.errors import log_unexpected
from inferflux.api.generation.events import GenerationEvent, GenerationResult
from inferflux.api.generation.service import Generation, GenerationService
from inferflux.api.sse import EventStreamResponse
from inferflux.engine.protocol import EmbeddingResult
from inferflux.errors import InferfluxError, ShuttingDown
from inferflux.models.serving import ServingState
from inferflux.security.context import RequestContext

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"
INTERNAL_ERROR = "internal server error; the failure was logged"


class Renderer(Protocol):
    """One dialect's wire format for one generation."""

    @property
    def stream_response(self) -> type[EventStreamResponse]:
        """The response that carries the frames: SSE (EventStreamResponse) or NDJSON."""
        ...

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        """The encoded frames of one event (none is fine)."""
        ...

    def error_frame(self, error: InferfluxError) -> bytes:
        """The frame that reports a failure after the stream started."""
        ...

    def end_frames(self) -> Sequence[bytes]:
        """What always ends the stream, after a failure too (`data: [DONE]`)."""
        ...

    def response(self, result: GenerationResult) -> Response:
        """The whole, collected generation as one response."""
        ...


async def respond(
    request: Request,
    start: Awaitable[Generation],
    renderer_for: Callable[[Generation], Renderer],
    *,
    stream: bool,
) -> Response:
    """Start the generation (`start`, e.g. `GenerationService.start(...)`), then answer
    with the stream of `renderer_for(generation)`'s frames or its collected response."""
    generation = await until_disconnect(request, start)
    if generation is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    try:
        renderer = renderer_for(generation)
    except BaseException:
        await generation.aclose()
        raise
    if stream:
        return renderer.stream_response(_frames(generation, renderer))
    result = await until_disconnect(request, generation.collect())
    if result is None:
        await generation.aclose()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if generation.cut:
        raise ShuttingDown(CUT)
    return renderer.response(result)


async def _frames(generation: Generation, renderer: Renderer) -> AsyncGenerator[bytes, None]:
    """The stream's frames; a failure becomes the dialect's error frame. Closing this
    generator (the client went away) closes the generation, which aborts the engine's
    unfinished requests. A generation cut by the server's shutdown ends with the error
    frame of ShuttingDown, then the end frames."""
    events = generation.events()
    try:
        async for event in events:
            if generation.cut:
                raise ShuttingDown(CUT)
            for frame in renderer.frames(event):
                yield frame
    except InferfluxError as exc:
        yield renderer.error_frame(exc)
    except Exception as exc:
        log_unexpected(exc, f"a {type(renderer).__name__} stream")
        yield renderer.error_frame(InferfluxError(INTERNAL_ERROR))
    finally:
        await events.aclose()
        await generation.aclose()
    for frame in renderer.end_frames():
        yield frame


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


async def embed_or_disconnect(
    request: Request,
    service: GenerationService,
    serving: ServingState,
    inputs: list[list[int]],
    context: RequestContext,
    *,
    normalize: bool = True,
) -> EmbeddingResult | None:
    """Embed `inputs` through the service; None when the client disconnected first (the
    engine then drops the request)."""
    return await until_disconnect(
        request, service.embed(serving, inputs, context, normalize=normalize)
    )
