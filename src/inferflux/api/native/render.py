"""The native API's view of a generation: its spec, its SSE events and its JSON outcome.

Owns: the native `GenerationSpec` (`native_spec`: the client's priority, no template for
/generate, the model's chat template for /chat), `NativeRenderer` (one SSE event per
released piece of text, `NativeStreamEvent`, the last one carrying the finish reason,
usage and timings; failures become an error event) and `Outcome`, a finished
generation for the routes' JSON bodies. Shapes live in `protocol.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starlette.responses import Response

from inferflux.api.generation import (
    ChoiceClosed,
    ChoiceOutput,
    ChoiceResult,
    FinishReason,
    GenerationDone,
    GenerationEvent,
    GenerationResult,
    GenerationSpec,
    Prompt,
    Timings,
    Usage,
    text_of,
)
from inferflux.api.native.protocol import (
    GenerationKnobs,
    NativeFinishReason,
    NativeStreamEvent,
    NativeTimings,
    NativeUsage,
)
from inferflux.api.sse import EventStreamResponse, sse_data, sse_error
from inferflux.errors import InferfluxError

_NATIVE_FINISH: dict[FinishReason, NativeFinishReason] = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
    FinishReason.CONTENT_FILTER: "content_filter",
}


def native_spec(
    id_prefix: str, body: GenerationKnobs, prompt: Prompt, param: str
) -> GenerationSpec:
    """One choice of `prompt` with the knobs of `body` (token limit checked strictly)."""
    return GenerationSpec(
        id_prefix=id_prefix,
        prompts=[prompt],
        sampling=body.sampling_params,
        prompt_param=param,
        max_tokens=body.max_tokens,
        priority=body.priority,
        stream=body.stream,
    )


def usage_of(result: ChoiceResult) -> NativeUsage:
    return NativeUsage(
        prompt_tokens=result.num_prompt_tokens,
        completion_tokens=result.num_output_tokens,
        total_tokens=result.num_prompt_tokens + result.num_output_tokens,
        cached_tokens=result.num_cached_tokens,
    )


def timings_of(timings: Timings, usage: Usage) -> NativeTimings:
    """Time to the first token and in all, from the route's start until now; the
    speculative drafts (llama-server's `draft_n` / `draft_n_accepted`)."""
    started = timings.started_ns
    first = timings.first_token_ns
    ttft = None if first is None else (first - started) / 1e9
    return NativeTimings(
        ttft_s=ttft,
        total_s=(time.monotonic_ns() - started) / 1e9,
        draft_n=usage.draft_tokens,
        draft_n_accepted=usage.draft_accepted_tokens,
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished non-streaming generation."""

    request_id: str
    text: str
    finish_reason: NativeFinishReason
    usage: NativeUsage
    timings: NativeTimings


class NativeRenderer:
    """The native SSE events, or the JSON body `build` makes of the `Outcome`."""

    stream_response = EventStreamResponse

    def __init__(self, request_id: str, build: Callable[[Outcome], Response]) -> None:
        self.request_id = request_id
        self.build = build
        self._index = 0
        self._held = ""  # the text of the last delta, sent with the finish
        self._result: ChoiceResult | None = None

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        if isinstance(event, ChoiceOutput):
            text = text_of(event.parts)
            if event.closing:
                self._held = text
                return ()
            if not text:
                return ()
            event_out = NativeStreamEvent(request_id=self.request_id, index=self._index, token=text)
            self._index += 1
            return (self._event(event_out),)
        if isinstance(event, ChoiceClosed):
            self._result = event.result
            return ()
        if isinstance(event, GenerationDone) and self._result is not None:
            result = self._result
            last = NativeStreamEvent(
                request_id=self.request_id,
                index=self._index,
                token=self._held,
                finish_reason=_NATIVE_FINISH[result.finish_reason],
                usage=usage_of(result),
                timings=timings_of(event.result.timings, event.result.usage),
            )
            return (self._event(last),)
        return ()

    @staticmethod
    def _event(event: NativeStreamEvent) -> bytes:
        return sse_data(event.model_dump(mode="json"))

    def error_frame(self, error: InferfluxError) -> bytes:
        return sse_error(error)

    def end_frames(self) -> Sequence[bytes]:
        return ()

    def response(self, result: GenerationResult) -> Response:
        (choice,) = result.choices
        outcome = Outcome(
            request_id=self.request_id,
            text=choice.text,
            finish_reason=_NATIVE_FINISH[choice.finish_reason],
            usage=usage_of(choice),
            timings=timings_of(result.timings, result.usage),
        )
        return self.build(outcome)
