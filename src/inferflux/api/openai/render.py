"""One OpenAI completion response, rendered from the generation service's events.

Owns `OpenAIRenderer` (the `Renderer` of chat and text completions: SSE chunks in which
choices interleave as they are produced, each choice opened first, the usage chunk when
`stream_options.include_usage`, then `data: [DONE]`, also after an error event; or one
JSON body), the `ChoiceRenderer` protocol each route implements for its choice shape, and
the two things every OpenAI choice shares: the finish_reason string and the
`structured_output` report of a JSON-constrained choice (api/structured.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec
from starlette.responses import Response

from inferflux.api.generation import (
    ChoiceClosed,
    ChoiceOpened,
    ChoiceOutput,
    ChoiceResult,
    Generation,
    GenerationDone,
    GenerationEvent,
    GenerationResult,
    Part,
    TokenEntry,
)
from inferflux.api.generation.http import Renderer
from inferflux.api.openai.envelope import ChunkEnvelope
from inferflux.api.sse import SSE_DONE, EventStreamResponse, sse_error
from inferflux.engine.messages import OPENAI_FINISH_REASON
from inferflux.errors import InferfluxError


def finish_reason_of(result: ChoiceResult) -> str:
    """OpenAI's finish_reason: "tool_calls" when the model stopped after calling."""
    reason = OPENAI_FINISH_REASON[result.finish_reason]
    return "tool_calls" if result.num_tool_calls and reason == "stop" else reason


def structured_fields(result: ChoiceResult) -> dict[str, object]:
    """`structured_output: {valid, error}` for a JSON-constrained choice, else nothing."""
    check = result.structured
    if check is None:
        return {}
    return {"structured_output": {"valid": check.valid, "error": check.error}}


# How another frontend that answers in OpenAI's shape adds to it (LM Studio's `stats`):
# the renderer of a started generation → the renderer the route answers with.
Decorate = Callable[[Generation, "OpenAIRenderer"], Renderer]


class ChoiceRenderer(Protocol):
    """Renders one choice of one route as OpenAI dicts (chat and completions differ)."""

    def opening(self) -> dict[str, object] | None:
        """The choice's first streamed chunk (chat: the role), or None."""
        ...

    def piece(self, parts: list[Part], entries: list[TokenEntry]) -> list[dict[str, object]]:
        """Streamed chunks for new parts and the logprob entries released with them."""
        ...

    def finish(self, parts: list[Part], result: ChoiceResult) -> list[dict[str, object]]:
        """The streamed chunks that end the choice (`parts`: what the tool-call parser
        still held); the last carries the finish_reason."""
        ...

    def final(self, result: ChoiceResult) -> dict[str, object]:
        """The whole choice of a non-streamed response."""
        ...


# (the choice's opening: its Choice and prompt logprobs) → its renderer
ChoiceRendererFactory = Callable[[ChoiceOpened], ChoiceRenderer]


def undecorated(generation: Generation, renderer: OpenAIRenderer) -> Renderer:
    """The `Decorate` of the OpenAI routes themselves: the renderer as it is."""
    return renderer


class OpenAIRenderer:
    """The SSE chunks or the JSON body of one chat or text completion."""

    stream_response = EventStreamResponse

    def __init__(
        self, envelope: ChunkEnvelope, generation: Generation, make: ChoiceRendererFactory
    ) -> None:
        self.envelope = envelope
        self.choices = {opened.choice.index: make(opened) for opened in generation.opened}

    @classmethod
    def of(
        cls,
        generation: Generation,
        model: str,
        system_fingerprint: str,
        object_names: tuple[str, str],
        *,
        include_usage: bool,
        make: ChoiceRendererFactory,
    ) -> OpenAIRenderer:
        """The renderer of `generation`, answering as `model` with `object_names` (the
        whole response's `object`, each chunk's)."""
        envelope = ChunkEnvelope(
            generation.response_id,
            model,
            system_fingerprint,
            object_names=object_names,
            include_usage=include_usage,
        )
        return cls(envelope, generation, make)

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        chunk = self.envelope.chunk
        if isinstance(event, ChoiceOutput):
            pieces = self.choices[event.index].piece(event.parts, event.logprobs)
            return [chunk([piece]) for piece in pieces]
        if isinstance(event, ChoiceOpened):
            opening = self.choices[event.choice.index].opening()
            return [chunk([opening])] if opening is not None else []
        if isinstance(event, ChoiceClosed):
            result = event.result
            *endings, last = self.choices[result.index].finish(event.parts, result)
            last = {**last, **structured_fields(result)}
            return [*(chunk([ending]) for ending in endings), chunk([last])]
        assert isinstance(event, GenerationDone)
        if not self.envelope.include_usage:
            return []
        return [self.envelope.usage(event.result.usage)]

    def error_frame(self, error: InferfluxError) -> bytes:
        return sse_error(error)

    def end_frames(self) -> Sequence[bytes]:
        return (SSE_DONE,)

    def response(self, result: GenerationResult) -> Response:
        choices = [
            {**self.choices[r.index].final(r), **structured_fields(r)} for r in result.choices
        ]
        body = self.envelope.full_response(choices, result.usage)
        return Response(msgspec.json.encode(body), media_type="application/json")
