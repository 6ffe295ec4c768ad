"""An Ollama generation rendered from the generation service's events: NDJSON lines or one
JSON object, with Ollama's metrics.

Owns: Ollama's timestamps (`created_at`: RFC 3339, nanoseconds, UTC), metrics
(`metrics_of`), logprobs (`logprob_items`), the NDJSON response (`application/x-ndjson`,
one JSON object per line), and `OllamaRenderer`, which turns events into lines or one
body through the route's `ResponseShape` (implemented in `generate.py` and `chat.py`).

Metrics, all in nanoseconds and never 0 (Ollama omits zero fields): `load_duration` is
the time from the request's arrival until it was submitted to the engine (parsing,
template, tokenizing: the model itself is always resident), `prompt_eval_duration` from
submission to the first delta (queueing, prefill, first token), `eval_duration` from the
first delta to the last, `total_duration` from arrival to the last delta.
`prompt_eval_count` is the whole prompt, cached prefix included.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import msgspec
from starlette.responses import Response

from inferflux.api.generation import (
    ChoiceClosed,
    ChoiceOutput,
    ChoiceResult,
    FinishReason,
    GenerationDone,
    GenerationEvent,
    GenerationResult,
    Part,
    Timings,
    TokenEntry,
    TokenText,
)
from inferflux.api.sse import EventStreamResponse
from inferflux.errors import InferfluxError

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


def metrics_of(result: ChoiceResult, timings: Timings) -> dict[str, int]:
    """Ollama's duration and count fields (durations in ns, each at least 1)."""
    end = timings.last_delta_ns or time.monotonic_ns()
    return {
        "total_duration": max(end - timings.started_ns, 1),
        "load_duration": max(timings.submitted_ns - timings.started_ns, 1),
        "prompt_eval_count": result.num_prompt_tokens,
        "prompt_eval_duration": max(timings.first_delta_ns - timings.submitted_ns, 1),
        "eval_count": result.num_output_tokens,
        "eval_duration": max(end - timings.first_delta_ns, 1),
    }


def done_fields(result: ChoiceResult) -> dict[str, object]:
    return {"done": True, "done_reason": done_reason(result.finish_reason)}


class ResponseShape(Protocol):
    """One route's objects: a streamed piece (None: nothing to send yet), and the last
    (`done: true`) object with the parts it carries (all of them when collected)."""

    def piece(self, parts: list[Part]) -> dict[str, object] | None: ...

    def final(
        self, parts: list[Part], result: ChoiceResult, timings: Timings
    ) -> dict[str, object]: ...


class OllamaRenderer:
    """NDJSON lines or one JSON object for a one-choice generation, through `shape`."""

    stream_response = NdjsonResponse

    def __init__(self, shape: ResponseShape, *, logprobs: bool) -> None:
        self.shape = shape
        self.logprobs = logprobs
        self._closed: ChoiceClosed | None = None

    def _with_logprobs(
        self, body: dict[str, object], entries: list[TokenEntry]
    ) -> dict[str, object]:
        if self.logprobs:
            body["logprobs"] = logprob_items(entries)
        return body

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        if isinstance(event, ChoiceOutput):
            piece = self.shape.piece(event.parts)
            if piece is None:
                return ()
            return (ndjson_line(self._with_logprobs(piece, event.logprobs)),)
        if isinstance(event, ChoiceClosed):
            self._closed = event
            return ()
        if isinstance(event, GenerationDone) and self._closed is not None:
            closed = self._closed
            final = self.shape.final(closed.parts, closed.result, event.result.timings)
            return (ndjson_line(self._with_logprobs(final, [])),)
        return ()

    def error_frame(self, error: InferfluxError) -> bytes:
        return ndjson_line({"error": error.message})

    def end_frames(self) -> Sequence[bytes]:
        return ()

    def response(self, result: GenerationResult) -> Response:
        (choice,) = result.choices
        final = self.shape.final(choice.parts, choice, result.timings)
        return json_response(self._with_logprobs(final, choice.logprobs))
