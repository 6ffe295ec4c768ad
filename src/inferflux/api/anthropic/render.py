"""An Anthropic `message`, rendered from the generation service's events: one JSON body, or
Anthropic's named SSE events.

Owns `MessagesRenderer` and the `message` shape: `content` blocks (`text`, and `tool_use`
`{id, name, input}` for each call the service parsed), `stop_reason` (`end_turn`,
`max_tokens`, `stop_sequence` with the matched `stop_sequence`, `tool_use` when the model
stopped after calling, `refusal` when a guardrail stopped it) and `usage` (`input_tokens`,
`output_tokens`, `cache_read_input_tokens`: prompt tokens whose KV came from the prefix
cache). A stream is `message_start`, then per block `content_block_start`,
`content_block_delta` (`text_delta`, or one `input_json_delta` with a call's whole
arguments) and `content_block_stop`, then `message_delta` (stop reason, usage) and
`message_stop`; a failure after the start is an `error` event. A JSON-constrained output
that fails its schema keeps `end_turn` and says so in `structured_output` (an InferFlux
extension, as on the OpenAI routes).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from starlette.responses import Response

from inferflux.api.errors import anthropic_error_body
from inferflux.api.generation import (
    ChoiceClosed,
    ChoiceOpened,
    ChoiceOutput,
    ChoiceResult,
    FinishReason,
    Generation,
    GenerationDone,
    GenerationEvent,
    GenerationResult,
    Part,
)
from inferflux.api.sse import EventStreamResponse, sse_event
from inferflux.api.tools import ToolCall
from inferflux.errors import InferfluxError

_STOP_REASON = {
    FinishReason.STOP: "end_turn",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.ABORT: "end_turn",
    FinishReason.CONTENT_FILTER: "refusal",
    FinishReason.ERROR: "end_turn",  # a failed JSON check: see `structured_output`
}


def message_id(response_id: str) -> str:
    """`msg_<hex>`, Anthropic's spelling of the service's `msg-<hex>`."""
    return response_id.replace("-", "_", 1)


def stop_reason(result: ChoiceResult) -> str:
    if result.num_tool_calls and result.finish_reason is FinishReason.STOP:
        return "tool_use"
    return _STOP_REASON[result.finish_reason]


def usage_of(result: ChoiceResult) -> dict[str, int]:
    return {
        "input_tokens": result.num_prompt_tokens,
        "output_tokens": result.num_output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": result.num_cached_tokens,
    }


def tool_use(call: ToolCall) -> dict[str, object]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments_object()}


def content_blocks(parts: list[Part]) -> list[dict[str, object]]:
    """The blocks of a whole message: runs of text as one text block, calls as tool_use."""
    blocks: list[dict[str, object]] = []
    for part in parts:
        if isinstance(part, ToolCall):
            blocks.append(tool_use(part))
        elif blocks and blocks[-1]["type"] == "text":
            blocks[-1]["text"] = str(blocks[-1]["text"]) + part
        elif part:
            blocks.append({"type": "text", "text": part})
    if blocks and blocks[-1]["type"] == "text" and any(b["type"] == "tool_use" for b in blocks):
        blocks = [b for b in blocks if b["type"] != "text" or str(b["text"]).strip()]
    return blocks


class MessagesRenderer:
    """The SSE events or the JSON body of one Anthropic message (one choice)."""

    stream_response = EventStreamResponse

    def __init__(self, generation: Generation, model: str) -> None:
        self.model = model
        self.id = message_id(generation.response_id)
        self.num_prompt_tokens = len(generation.plan.choices[0].request.prompt_token_ids)
        self._index = -1  # the content block being streamed
        self._open: str | None = None  # its type, while open

    def _message(self, content: list[dict[str, object]]) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
        }

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        if isinstance(event, ChoiceOutput):
            return self._parts(event.parts)
        if isinstance(event, ChoiceOpened):
            usage = {"input_tokens": self.num_prompt_tokens, "output_tokens": 0}
            start = {**self._message([]), "usage": usage}
            return (sse_event("message_start", {"type": "message_start", "message": start}),)
        if isinstance(event, ChoiceClosed):
            return [*self._parts(event.parts), *self._close_block(), *self._ending(event.result)]
        assert isinstance(event, GenerationDone)
        return (sse_event("message_stop", {"type": "message_stop"}),)

    def _parts(self, parts: list[Part]) -> list[bytes]:
        frames: list[bytes] = []
        for part in parts:
            if isinstance(part, ToolCall):
                frames += self._close_block()
                block: dict[str, object] = {"type": "tool_use", "id": part.id}
                frames += self._start({**block, "name": part.name, "input": {}})
                arguments: dict[str, object] = {"partial_json": part.arguments}
                frames.append(self._delta({"type": "input_json_delta", **arguments}))
                frames += self._close_block()
            elif part:
                if self._open != "text":
                    frames += self._close_block()
                    frames += self._start({"type": "text", "text": ""})
                frames.append(self._delta({"type": "text_delta", "text": part}))
        return frames

    def _start(self, block: dict[str, object]) -> list[bytes]:
        self._index += 1
        self._open = str(block["type"])
        payload = {"type": "content_block_start", "index": self._index, "content_block": block}
        return [sse_event("content_block_start", payload)]

    def _delta(self, delta: dict[str, object]) -> bytes:
        payload = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return sse_event("content_block_delta", payload)

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        payload = {"type": "content_block_stop", "index": self._index}
        return [sse_event("content_block_stop", payload)]

    def _ending(self, result: ChoiceResult) -> list[bytes]:
        delta = {"stop_reason": stop_reason(result), "stop_sequence": result.stop_sequence}
        payload: dict[str, object] = {"type": "message_delta", "delta": delta}
        payload["usage"] = usage_of(result)
        payload.update(_structured(result))
        return [sse_event("message_delta", payload)]

    def error_frame(self, error: InferfluxError) -> bytes:
        return sse_event("error", anthropic_error_body(error))

    def end_frames(self) -> Sequence[bytes]:
        return ()

    def response(self, result: GenerationResult) -> Response:
        (choice,) = result.choices
        body = self._message(content_blocks(choice.parts))
        body["stop_reason"] = stop_reason(choice)
        body["stop_sequence"] = choice.stop_sequence
        body["usage"] = usage_of(choice)
        body.update(_structured(choice))
        return Response(msgspec.json.encode(body), media_type="application/json")


def _structured(result: ChoiceResult) -> dict[str, object]:
    check = result.structured
    if check is None:
        return {}
    return {"structured_output": {"valid": check.valid, "error": check.error}}
