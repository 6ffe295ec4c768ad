"""Running one Ollama generation: NDJSON stream or one JSON object, with Ollama's metrics.

Owns: the engine request of `/api/generate` and `/api/chat` (`build_request`), Ollama's
timestamps (`created_at`: RFC 3339, nanoseconds, UTC) and metrics (`Progress`), the
NDJSON response (`application/x-ndjson`, one JSON object per line) and the loop that
turns `RequestDelta`s into lines or one body. Reuses the engine plumbing of
`api/openai/generation.py` (submit, DeltaStream, until_disconnect, resolve_max_tokens)
and the logprob alignment of `api/openai/logprobs.py`. Does not own: the per-route body
shapes (`ResponseShape`, implemented in `generate.py` and `chat.py`).

Metrics, all in nanoseconds and never 0 (Ollama omits zero fields): `load_duration` is
the time from the request's arrival until it was submitted to the engine (parsing,
template, tokenizing: the model itself is always resident), `prompt_eval_duration` from
submission to the first delta (queueing, prefill, first token), `eval_duration` from the
first delta to the last, `total_duration` from arrival to the last delta.
`prompt_eval_count` is the whole prompt, cached prefix included.

Cancellation: a client that disconnects before the first delta or during a non-streaming
request cancels the wait and closes the DeltaStream (aborting the request in the engine);
during a stream, `NdjsonResponse` closes the line generator, whose `finally` does the same.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from inferflux.api.deps import ServingState
from inferflux.api.errors import log_unexpected
from inferflux.api.ollama.protocol import GenerationBody, requested_max_tokens, sampling_params
from inferflux.api.openai.generation import (
    CLIENT_CLOSED_REQUEST,
    DeltaStream,
    check_delta,
    resolve_max_tokens,
    submit_all,
    until_disconnect,
)
from inferflux.api.openai.logprobs import LogprobAligner, TokenEntry, TokenText, TokenTexts
from inferflux.api.sse import EventStreamResponse
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import EngineError, InferfluxError, InvalidRequest

NDJSON_MEDIA_TYPE = "application/x-ndjson"
_encoder = msgspec.json.Encoder()


def rfc3339_nano(ns: int) -> str:
    """`ns` (unix nanoseconds) as Go's time.RFC3339Nano in UTC: trailing zeros dropped,
    `2024-05-01T12:00:00.123456789Z`."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    digits = f"{fraction:09d}".rstrip("0")
    return f"{stamp}.{digits}Z" if digits else f"{stamp}Z"


def created_at() -> str:
    """Now, as Ollama's `created_at`."""
    return rfc3339_nano(time.time_ns())


def ndjson_line(payload: object) -> bytes:
    """One NDJSON record: the JSON object and a newline."""
    return _encoder.encode(payload) + b"\n"


def json_response(payload: object, status_code: int = 200) -> Response:
    return Response(_encoder.encode(payload), status_code, media_type="application/json")


class NdjsonResponse(EventStreamResponse):
    """`application/x-ndjson` fed by a generator of lines; like `EventStreamResponse`, it
    stops and closes the generator when the client disconnects."""

    media_type = NDJSON_MEDIA_TYPE


def done_reason(finish: FinishReason | None) -> str:
    """Ollama's `done_reason`: `length` for a token limit or a full context,
    `content_filter` when a guardrail stopped the output, else `stop`."""
    if finish is FinishReason.LENGTH:
        return "length"
    return "content_filter" if finish is FinishReason.CONTENT_FILTER else "stop"


@dataclass(slots=True)
class Progress:
    """One request's counters and clock readings (`time.monotonic_ns()`); `feed` every
    delta in order."""

    started_ns: int
    num_prompt_tokens: int = 0
    submitted_ns: int = 0
    first_delta_ns: int = 0
    last_delta_ns: int = 0
    num_output_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    def feed(self, delta: RequestDelta) -> None:
        """Count `delta`; raises EngineError / QueueTimeout when it ends the request badly."""
        check_delta(delta)
        self.last_delta_ns = time.monotonic_ns()
        self.output_token_ids.extend(delta.token_ids)
        self.num_output_tokens = max(self.num_output_tokens, delta.num_output_tokens)
        self.finish = delta.finish_reason

    def metrics(self) -> dict[str, int]:
        """Ollama's duration and count fields (durations in ns, each at least 1)."""
        end = self.last_delta_ns or time.monotonic_ns()
        return {
            "total_duration": max(end - self.started_ns, 1),
            "load_duration": max(self.submitted_ns - self.started_ns, 1),
            "prompt_eval_count": self.num_prompt_tokens,
            "prompt_eval_duration": max(self.first_delta_ns - self.submitted_ns, 1),
            "eval_count": self.num_output_tokens,
            "eval_duration": max(end - self.first_delta_ns, 1),
        }

    def done_fields(self) -> dict[str, object]:
        return {"done": True, "done_reason": done_reason(self.finish)}


def _token_logprob(text: TokenText, logprob: float) -> dict[str, object]:
    return {"token": text.text, "logprob": logprob, "bytes": list(text.raw)}


def logprob_items(entries: list[TokenEntry]) -> list[dict[str, object]]:
    """Ollama's `logprobs`: `[{token, logprob, bytes, top_logprobs: [{token, logprob,
    bytes}]}]`, one per generated token whose text was released."""
    items = []
    for entry in entries:
        item = _token_logprob(entry.token, entry.logprob or 0.0)
        item["top_logprobs"] = [_token_logprob(t, lp) for t, lp in entry.top or ()]
        items.append(item)
    return items


class ResponseShape(Protocol):
    """One route's objects: a streamed piece (None: nothing to send yet), and the last
    (`done: true`) object."""

    def piece(self, text: str) -> dict[str, object] | None: ...

    def final(self, text: str, progress: Progress) -> dict[str, object]: ...


def build_request(
    prefix: str,
    body: GenerationBody,
    token_ids: list[int],
    model_info: ModelInfo,
    param: str,
    constraint: str | None = None,
) -> AddRequest:
    """The engine request (`constraint`: the compiled `format`). `num_predict` is clamped
    to what the context leaves (Ollama never fails for it); raises ContextLengthExceeded
    when the prompt fills the context."""
    if not token_ids:
        raise InvalidRequest("the prompt is empty", param=param)
    n_ctx = model_info.n_ctx
    requested = requested_max_tokens(body.options)
    if requested is not None:
        requested = min(requested, max(n_ctx - len(token_ids), 1))
    max_tokens = resolve_max_tokens(len(token_ids), requested, n_ctx, param)
    sampling = sampling_params(
        body.options,
        max_tokens=max_tokens,
        n_ctx=n_ctx,
        logprobs=body.num_logprobs(),
        constraint=constraint,
    )
    return AddRequest(
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        prompt_token_ids=token_ids,
        sampling=sampling,
        priority=body.engine_priority(),
    )


class _Lines:
    """Turns deltas into the route's objects, with logprobs when asked for."""

    def __init__(
        self, shape: ResponseShape, progress: Progress, aligner: LogprobAligner, logprobs: bool
    ) -> None:
        self.shape = shape
        self.progress = progress
        self.aligner = aligner
        self.logprobs = logprobs

    def _with_logprobs(
        self, body: dict[str, object], entries: list[TokenEntry]
    ) -> dict[str, object]:
        if self.logprobs:
            body["logprobs"] = logprob_items(entries)
        return body

    def objects(self, delta: RequestDelta) -> list[dict[str, object]]:
        """The NDJSON objects for one delta (none when it released nothing)."""
        self.progress.feed(delta)
        entries = self.aligner.push(delta)
        objects = []
        piece = self.shape.piece(delta.text) if delta.text or entries else None
        if piece is not None:
            objects.append(self._with_logprobs(piece, entries))
        if delta.finish_reason is not None:
            objects.append(self._with_logprobs(self.shape.final("", self.progress), []))
        return objects

    async def collect(self, stream: DeltaStream) -> dict[str, object]:
        """The whole generation as one object (closing the stream in every case)."""
        parts: list[str] = []
        entries: list[TokenEntry] = []
        try:
            async for delta in stream:
                self.progress.feed(delta)
                parts.append(delta.text)
                entries.extend(self.aligner.push(delta))
        finally:
            await stream.aclose()
        if self.progress.finish is None:
            raise EngineError("the engine ended the request without finishing it")
        return self._with_logprobs(self.shape.final("".join(parts), self.progress), entries)

    async def stream(self, stream: DeltaStream) -> AsyncGenerator[bytes, None]:
        """NDJSON lines; a failure after the stream started becomes `{"error": ...}`."""
        try:
            async for delta in stream:
                for payload in self.objects(delta):
                    yield ndjson_line(payload)
        except InferfluxError as exc:
            yield ndjson_line({"error": exc.message})
        except Exception as exc:
            log_unexpected(exc, "an Ollama NDJSON stream")
            yield ndjson_line({"error": "internal server error; the failure was logged"})
        finally:
            await stream.aclose()


async def respond(
    request: Request,
    serving: ServingState,
    add: AddRequest,
    shape: ResponseShape,
    progress: Progress,
    *,
    stream: bool,
) -> Response:
    """Run `add` and answer: NDJSON lines, or one JSON object."""
    progress.num_prompt_tokens = len(add.prompt_token_ids)
    progress.submitted_ns = time.monotonic_ns()
    streams = await until_disconnect(request, submit_all(serving.engine, [add]))
    if streams is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    progress.first_delta_ns = time.monotonic_ns()
    logprobs = add.sampling.logprobs is not None
    aligner = LogprobAligner(TokenTexts(serving.tokenizer), enabled=logprobs)
    lines = _Lines(shape, progress, aligner, logprobs)
    if stream:
        return NdjsonResponse(lines.stream(streams[0]))
    body = await until_disconnect(request, lines.collect(streams[0]))
    if body is None:
        await streams[0].aclose()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return json_response(body)
