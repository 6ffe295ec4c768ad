"""Tool calling on /v1/chat/completions: the request side (`resolve_chat_tools`) and the
choice shape that renders the calls the generation service parsed (`ToolChatChoice`).

Owns the OpenAI tool-call response shapes:

- non-streamed: `message.tool_calls[] = {id, type: "function", function: {name,
  arguments}}` (arguments: a JSON string), `content` the text around the calls or null,
  `finish_reason` "tool_calls" when the model stopped after calling;
- streamed: per call, a header delta `{index, id, type, function: {name, arguments: ""}}`
  then its arguments (`{index, function: {arguments}}`); `index` counts calls within the
  choice. The call markup (`<tool_call>`...) is never streamed as content: the service's
  parser (`api/tools/parser.py`) holds back text that may start a call.

The formats, the prompt, the grammar and the parser live in `api/tools/`.
"""

from __future__ import annotations

from inferflux.api.generation import ChoiceResult, Part, TokenEntry
from inferflux.api.openai.envelope import chat_chunk_choice
from inferflux.api.openai.logprobs import chat_logprobs
from inferflux.api.openai.protocol import ChatCompletionRequest
from inferflux.api.openai.render import finish_reason_of
from inferflux.api.tools import ToolCall, ToolPlan, resolve_tools
from inferflux.engine.grammar import ConstraintCompiler


def resolve_chat_tools(
    body: ChatCompletionRequest, compiler: ConstraintCompiler
) -> ToolPlan | None:
    """Resolve `tools` / `tool_choice` / `parallel_tool_calls` (None: the model may call
    none). Raises InvalidRequest naming the field at fault (parameter schemas are held to
    the `structured_output.*` bounds first)."""
    return resolve_tools(
        body.tools,
        body.tool_choice,
        body.parallel_tool_calls,
        check_bounds=compiler.check_schema_bounds,
    )


def tool_call_dict(call: ToolCall) -> dict[str, object]:
    """OpenAI's `tool_calls[]` entry of a whole message."""
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": call.id, "type": "function", "function": function}


class ToolChatChoice:
    """A chat choice whose parts may hold tool calls (the `ChoiceRenderer` of a request
    with a tool plan). One instance per choice; it numbers the streamed calls."""

    def __init__(self, index: int, *, logprobs: bool) -> None:
        self.index = index
        self.logprobs = logprobs
        self.num_streamed_calls = 0

    def _chunk(
        self, delta: dict[str, object], finish_reason: str | None, logprobs: object = None
    ) -> dict[str, object]:
        return chat_chunk_choice(self.index, delta, finish_reason, logprobs)

    def _deltas(self, parts: list[Part]) -> list[dict[str, object]]:
        """Deltas of parts: content, or a call's header then its arguments."""
        deltas: list[dict[str, object]] = []
        for part in parts:
            if isinstance(part, str):
                deltas.append({"content": part})
                continue
            index, self.num_streamed_calls = self.num_streamed_calls, self.num_streamed_calls + 1
            function = {"name": part.name, "arguments": ""}
            header = {"index": index, "id": part.id, "type": "function", "function": function}
            arguments = {"index": index, "function": {"arguments": part.arguments}}
            deltas += [{"tool_calls": [header]}, {"tool_calls": [arguments]}]
        return deltas

    def opening(self) -> dict[str, object] | None:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def piece(self, parts: list[Part], entries: list[TokenEntry]) -> list[dict[str, object]]:
        deltas = self._deltas(parts)
        if not (self.logprobs and entries):
            return [self._chunk(delta, None) for delta in deltas]
        logprobs = chat_logprobs(entries)
        first, rest = (deltas[0], deltas[1:]) if deltas else ({}, [])
        return [self._chunk(first, None, logprobs)] + [self._chunk(d, None) for d in rest]

    def finish(self, parts: list[Part], result: ChoiceResult) -> list[dict[str, object]]:
        chunks = [self._chunk(delta, None) for delta in self._deltas(parts)]
        return [*chunks, self._chunk({}, finish_reason_of(result))]

    def final(self, result: ChoiceResult) -> dict[str, object]:
        calls = [p for p in result.parts if isinstance(p, ToolCall)]
        content: str | None = "".join(p for p in result.parts if isinstance(p, str))
        message: dict[str, object] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["content"] = (content or "").strip() or None
            message["tool_calls"] = [tool_call_dict(call) for call in calls]
        return {
            "index": self.index,
            "message": message,
            "logprobs": chat_logprobs(result.logprobs) if self.logprobs else None,
            "finish_reason": finish_reason_of(result),
        }
