"""One native generation through the engine: build the request, run it, answer in JSON or SSE.

Owns: the native `AddRequest` (with the client's priority), reading a request's deltas
into `Outcome` (text, finish reason, token counts, timings) and the native SSE stream.
Reuses the engine plumbing of `api/openai/generation.py` (submit, DeltaStream,
until_disconnect, resolve_max_tokens). Does not own: the response shapes (`protocol.py`).

Cancellation: a client that disconnects while we wait (before the first token, or during
a non-streaming request) cancels the wait and closes the DeltaStream, which aborts the
request in the engine; during a stream, `EventStreamResponse` does the same by closing
the event generator, whose `finally` closes the DeltaStream.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from inferflux.api.errors import log_unexpected
from inferflux.api.native.protocol import (
    GenerationKnobs,
    NativeFinishReason,
    NativeStreamEvent,
    NativeTimings,
    NativeUsage,
)
from inferflux.api.openai.generation import (
    CLIENT_CLOSED_REQUEST,
    DeltaStream,
    resolve_max_tokens,
    submit,
    until_disconnect,
)
from inferflux.api.sse import EventStreamResponse, sse_data, sse_error
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta
from inferflux.engine.protocol import EngineClient, ModelInfo
from inferflux.errors import EngineError, InferfluxError, InvalidRequest, QueueTimeout

logger = logging.getLogger(__name__)

_NATIVE_FINISH: dict[FinishReason, NativeFinishReason] = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
    FinishReason.CONTENT_FILTER: "content_filter",
}


def build_request(
    prefix: str,
    body: GenerationKnobs,
    prompt_token_ids: list[int],
    model_info: ModelInfo,
    param: str,
) -> AddRequest:
    """The engine request; raises InvalidRequest (empty prompt) or ContextLengthExceeded."""
    if not prompt_token_ids:
        raise InvalidRequest("the prompt is empty", param=param)
    max_tokens = resolve_max_tokens(len(prompt_token_ids), body.max_tokens, model_info.n_ctx, param)
    return AddRequest(
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        prompt_token_ids=prompt_token_ids,
        sampling=body.sampling_params(max_tokens),
        priority=body.priority,
    )


@dataclass(slots=True)
class Progress:
    """What one request produced so far; `feed` every delta in order."""

    num_prompt_tokens: int
    started_at: float  # time.monotonic() when the route started
    first_token_at: float | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0

    def feed(self, delta: RequestDelta) -> None:
        """Count `delta`. Raises EngineError / QueueTimeout if it ends the request badly."""
        if self.first_token_at is None and (delta.token_ids or delta.text):
            self.first_token_at = time.monotonic()
        self.num_output_tokens = max(self.num_output_tokens, delta.num_output_tokens)
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        if delta.finish_reason is FinishReason.ERROR:
            raise EngineError(f"generation failed in the engine: {delta.error or 'unknown error'}")
        if delta.finish_reason is FinishReason.TIMEOUT:
            raise QueueTimeout("the request waited in the queue too long and never ran")

    def usage(self) -> NativeUsage:
        return NativeUsage(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self.num_output_tokens,
            total_tokens=self.num_prompt_tokens + self.num_output_tokens,
            cached_tokens=self.num_cached_tokens,
        )

    def timings(self) -> NativeTimings:
        now = time.monotonic()
        ttft = None if self.first_token_at is None else self.first_token_at - self.started_at
        return NativeTimings(ttft_s=ttft, total_s=now - self.started_at)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished non-streaming generation."""

    text: str
    finish_reason: NativeFinishReason
    usage: NativeUsage
    timings: NativeTimings


async def collect(stream: DeltaStream, progress: Progress) -> Outcome:
    """Read the whole generation (closing the stream in every case)."""
    parts: list[str] = []
    finish: FinishReason | None = None
    try:
        async for delta in stream:
            progress.feed(delta)
            parts.append(delta.text)
            finish = delta.finish_reason
    finally:
        await stream.aclose()
    if finish is None:
        raise EngineError("the engine ended the request without finishing it")
    return Outcome("".join(parts), _NATIVE_FINISH[finish], progress.usage(), progress.timings())


async def stream_events(
    stream: DeltaStream, progress: Progress, request_id: str
) -> AsyncGenerator[bytes, None]:
    """The native SSE events of a generation (see `NativeStreamEvent`); failures become an error
    event. Closing this generator early closes the stream, which aborts the request."""
    index = 0
    try:
        async for delta in stream:
            progress.feed(delta)
            if delta.finish_reason is not None:
                yield _event(
                    NativeStreamEvent(
                        request_id=request_id,
                        index=index,
                        token=delta.text,
                        finish_reason=_NATIVE_FINISH[delta.finish_reason],
                        usage=progress.usage(),
                        timings=progress.timings(),
                    )
                )
            elif delta.text:
                yield _event(
                    NativeStreamEvent(request_id=request_id, index=index, token=delta.text)
                )
                index += 1
    except InferfluxError as exc:
        yield sse_error(exc)
    except Exception as exc:
        log_unexpected(exc, "a native event stream")
        yield sse_error(InferfluxError("internal server error; the failure was logged"))
    finally:
        await stream.aclose()


def _event(event: NativeStreamEvent) -> bytes:
    return sse_data(event.model_dump(mode="json"))


async def respond(
    request: Request,
    engine: EngineClient,
    add: AddRequest,
    *,
    stream: bool,
    started_at: float,
    build: Callable[[Outcome], Response],
) -> Response:
    """Run `add` and answer: the SSE stream, or the JSON response `build` makes."""
    progress = Progress(num_prompt_tokens=len(add.prompt_token_ids), started_at=started_at)
    deltas = await until_disconnect(request, submit(engine, add))
    if deltas is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if stream:
        return EventStreamResponse(stream_events(deltas, progress, add.request_id))
    outcome = await until_disconnect(request, collect(deltas, progress))
    if outcome is None:
        await deltas.aclose()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return build(outcome)
