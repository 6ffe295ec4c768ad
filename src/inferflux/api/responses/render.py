"""An OpenAI `response` object, rendered from the generation service's events: one JSON
body, or the Responses API's typed SSE events.

Owns `ResponsesRenderer` and the response shape: `output` items (a `message` with one
`output_text` part for the text, a `function_call` `{call_id, name, arguments}` for each
call the service parsed), `status` (`completed`; `incomplete` with `incomplete_details.
reason` `max_output_tokens` or `content_filter`; `failed` with `error`), `usage`
(`input_tokens` with `input_tokens_details.cached_tokens`: prompt tokens whose KV came from
the prefix cache, `output_tokens`, `total_tokens`) and the request's settings echoed. A
stream is `response.created`, `response.in_progress`, then per item
`response.output_item.added`, its deltas (`response.content_part.added`,
`response.output_text.delta`..., `.done`; or `response.function_call_arguments.delta` and
`.done`) and `response.output_item.done`, then `response.completed` (or `.incomplete`); a
failure after the start is `response.failed`. Every event carries a `sequence_number`.
When the response is finished, `on_finished(body, output_items)` is called once (the route
stores it; output items are valid input items of a follow-up).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

import msgspec
from starlette.responses import Response

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
    Usage,
)
from inferflux.api.responses.protocol import FunctionChoice, ResponsesRequest
from inferflux.api.sse import EventStreamResponse, sse_event
from inferflux.api.tools import ToolCall
from inferflux.errors import InferfluxError

# (the response object, its output items)
OnFinished = Callable[[dict[str, object], list[dict[str, object]]], None]

_INCOMPLETE = {
    FinishReason.LENGTH: "max_output_tokens",
    FinishReason.CONTENT_FILTER: "content_filter",
}


def response_id(generation_id: str) -> str:
    """`resp_<hex>`, OpenAI's spelling of the service's `resp-<hex>`."""
    return generation_id.replace("-", "_", 1)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_of(usage: Usage) -> dict[str, object]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, object]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, object]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status == "completed" else "",
        "status": status,
    }


def settings_echo(body: ResponsesRequest, model: str) -> dict[str, object]:
    """The request's settings as a response object repeats them."""
    text = body.text.model_dump(by_alias=True, exclude_none=True) if body.text else {}
    choice = body.tool_choice or "auto"
    return {
        "model": model,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "store": body.stores(),
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "text": {"format": {"type": "text"}, **text},
        "tools": [t.model_dump(by_alias=True, exclude_none=True) for t in body.tools or []],
        "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "truncation": "disabled",
        "reasoning": {"effort": None, "summary": None},
        "metadata": dict(body.metadata or {}),
        "user": body.user,
        "service_tier": "default",
    }


class ResponsesRenderer:
    """The SSE events or the JSON body of one `response` (one choice)."""

    stream_response = EventStreamResponse

    def __init__(
        self, generation: Generation, settings: dict[str, object], on_finished: OnFinished
    ) -> None:
        self.id = response_id(generation.response_id)
        self.created_at = int(time.time())
        self.settings = settings
        self.on_finished = on_finished
        self._sequence = 0
        self._output: list[dict[str, object]] = []  # finished items
        self._message_id: str | None = None  # the message item being streamed
        self._where: dict[str, object] = {}  # its item_id, output_index, content_index
        self._text = ""  # its text so far
        self._pending = ""  # whitespace held back until text follows
        self._result: ChoiceResult | None = None

    def response_object(
        self, status: str, output: list[dict[str, object]], usage: dict[str, object] | None
    ) -> dict[str, object]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "output": output,
            "usage": usage,
            **self.settings,
        }

    def _event(self, kind: str, payload: dict[str, object]) -> bytes:
        frame = sse_event(kind, {"type": kind, "sequence_number": self._sequence, **payload})
        self._sequence += 1
        return frame

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        if isinstance(event, ChoiceOutput):
            return self._parts(event.parts)
        if isinstance(event, ChoiceOpened):
            started: dict[str, object] = {"response": self.response_object("in_progress", [], None)}
            return [
                self._event("response.created", started),
                self._event("response.in_progress", started),
            ]
        if isinstance(event, ChoiceClosed):
            self._result = event.result
            frames = self._parts(event.parts)
            if self._message_id is None and not self._output:
                frames += self._open_message()  # an empty answer is an empty message
            return [*frames, *self._close_message()]
        assert isinstance(event, GenerationDone)
        body = self._finished(event.result.usage, self._output)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return [self._event(kind, {"response": body})]

    def _parts(self, parts: list[Part]) -> list[bytes]:
        frames: list[bytes] = []
        for part in parts:
            if isinstance(part, ToolCall):
                frames += self._close_message()
                frames += self._call(part)
            elif self._message_id is None and not part.strip():
                self._pending += part
            elif part:
                if self._message_id is None:
                    frames += self._open_message()
                text, self._pending = self._pending + part, ""
                self._text += text
                delta = {**self._where, "delta": text, "logprobs": []}
                frames.append(self._event("response.output_text.delta", delta))
        return frames

    def _open_message(self) -> list[bytes]:
        self._message_id = _item_id("msg")
        self._text = ""
        # where the message's text goes: every event of its one output_text part says it
        self._where = {"item_id": self._message_id, "output_index": len(self._output)}
        self._where["content_index"] = 0
        item = message_item(self._message_id, "", "in_progress")
        item["content"] = []
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        added = {"output_index": len(self._output), "item": item}
        return [
            self._event("response.output_item.added", added),
            self._event("response.content_part.added", {**self._where, "part": part}),
        ]

    def _close_message(self) -> list[bytes]:
        if self._message_id is None:
            return []
        where = self._where
        item = message_item(self._message_id, self._text, self._item_status())
        content = item["content"]
        assert isinstance(content, list)
        text = {**where, "text": self._text, "logprobs": []}
        frames = [
            self._event("response.output_text.done", text),
            self._event("response.content_part.done", {**where, "part": content[0]}),
            self._event(
                "response.output_item.done", {"output_index": where["output_index"], "item": item}
            ),
        ]
        self._output.append(item)
        self._message_id = None
        return frames

    def _item_status(self) -> str:
        """`incomplete` for the message of a response cut short, else `completed`."""
        result = self._result
        cut = result is not None and result.finish_reason in _INCOMPLETE
        return "incomplete" if cut else "completed"

    def _call(self, call: ToolCall) -> list[bytes]:
        item_id, index = _item_id("fc"), len(self._output)
        where = {"item_id": item_id, "output_index": index}
        done = call_item(item_id, call)
        self._output.append(done)
        return [
            self._event(
                "response.output_item.added",
                {"output_index": index, "item": call_item(item_id, call, "in_progress")},
            ),
            self._event(
                "response.function_call_arguments.delta", {**where, "delta": call.arguments}
            ),
            self._event(
                "response.function_call_arguments.done",
                {**where, "name": call.name, "arguments": call.arguments},
            ),
            self._event("response.output_item.done", {"output_index": index, "item": done}),
        ]

    def _finished(self, usage: Usage, output: list[dict[str, object]]) -> dict[str, object]:
        result = self._result
        reason = _INCOMPLETE.get(result.finish_reason) if result is not None else None
        body = self.response_object(
            "incomplete" if reason else "completed", output, usage_of(usage)
        )
        if reason is not None:
            body["incomplete_details"] = {"reason": reason}
        if result is not None and result.structured is not None:
            check = result.structured
            body["structured_output"] = {"valid": check.valid, "error": check.error}
        self.on_finished(body, output)
        return body

    def error_frame(self, error: InferfluxError) -> bytes:
        body = self.response_object("failed", self._output, None)
        body["error"] = {"code": error.code, "message": error.message}
        self.on_finished(body, list(self._output))
        return self._event("response.failed", {"response": body})

    def end_frames(self) -> Sequence[bytes]:
        return ()

    def response(self, result: GenerationResult) -> Response:
        (choice,) = result.choices
        self._result = choice
        body = self._finished(result.usage, output_items(choice.parts, self._item_status()))
        return Response(msgspec.json.encode(body), media_type="application/json")


def output_items(parts: list[Part], status: str = "completed") -> list[dict[str, object]]:
    """The items of a whole response: its text as one message, each call as a
    function_call (whitespace-only text beside calls left out)."""
    calls = [part for part in parts if isinstance(part, ToolCall)]
    text = "".join(part for part in parts if isinstance(part, str))
    items: list[dict[str, object]] = []
    if text.strip() or not calls:
        items.append(message_item(_item_id("msg"), text, status))
    return items + [call_item(_item_id("fc"), call) for call in calls]
