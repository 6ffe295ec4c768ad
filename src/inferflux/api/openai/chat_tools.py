"""Tool calling on /v1/chat/completions: the request side (`plan_chat_tools`) and the
choice shape that turns generated text into `tool_calls` (`ToolChatChoice`).

Owns the OpenAI tool-call response shapes:

- non-streamed: `message.tool_calls[] = {id, type: "function", function: {name,
  arguments}}` (arguments: a JSON string), `content` the text around the calls or null,
  `finish_reason` "tool_calls" when the model stopped after calling;
- streamed: per call, a header delta `{index, id, type, function: {name, arguments: ""}}`
  then its arguments (`{index, function: {arguments}}`); `index` counts calls within the
  choice. The call markup (`<tool_call>`...) is never streamed as content: the parser
  (`api/tools/parser.py`) holds back text that may start a call.

The formats, the prompt, the grammar and the parser live in `api/tools/`.
"""

from __future__ import annotations

from inferflux.api.openai.envelope import chat_chunk_choice
from inferflux.api.openai.logprobs import TokenEntry, chat_logprobs
from inferflux.api.openai.protocol import ChatCompletionRequest
from inferflux.api.tools import (
    ChatTools,
    ToolCall,
    ToolCallParser,
    ToolFormat,
    ToolPlan,
    plan_tools,
    resolve_tools,
)
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.protocol import Tokenizer


def plan_chat_tools(
    body: ChatCompletionRequest,
    template: ChatTemplate,
    tokenizer: Tokenizer,
    compiler: ConstraintCompiler,
) -> ChatTools:
    """Resolve `tools` / `tool_choice` / `parallel_tool_calls` and the message history
    against the template. Raises InvalidRequest naming the field at fault (parameter
    schemas are held to the `structured_output.*` bounds first)."""
    plan = resolve_tools(
        body.tools,
        body.tool_choice,
        body.parallel_tool_calls,
        check_bounds=compiler.check_schema_bounds,
    )
    return plan_tools(body.template_messages(), plan, template, tokenizer)


def tool_call_dict(call: ToolCall) -> dict[str, object]:
    """OpenAI's `tool_calls[]` entry of a whole message."""
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": call.id, "type": "function", "function": function}


def finish_reason_with_calls(finish_reason: str, num_calls: int) -> str:
    """ "tool_calls" when the model stopped after calling, else the engine's reason."""
    return "tool_calls" if num_calls and finish_reason == "stop" else finish_reason


class ToolChatChoice:
    """A chat choice whose text may hold tool calls (the `ChoiceRenderer` of a request
    with a tool plan). One instance per choice; it keeps the streaming parser."""

    def __init__(self, index: int, *, logprobs: bool, tool_format: ToolFormat, plan: ToolPlan):
        self.index = index
        self.logprobs = logprobs
        self.tool_format = tool_format
        self.names = plan.names()
        self.parser = ToolCallParser(tool_format, self.names)
        self.num_streamed_calls = 0

    def _chunk(
        self, delta: dict[str, object], finish_reason: str | None, logprobs: object = None
    ) -> dict[str, object]:
        return chat_chunk_choice(self.index, delta, finish_reason, logprobs)

    def _deltas(self, events: list[str | ToolCall]) -> list[dict[str, object]]:
        """Deltas of parser events: content, or a call's header then its arguments."""
        deltas: list[dict[str, object]] = []
        for event in events:
            if isinstance(event, str):
                deltas.append({"content": event})
                continue
            index, self.num_streamed_calls = self.num_streamed_calls, self.num_streamed_calls + 1
            function = {"name": event.name, "arguments": ""}
            header = {"index": index, "id": event.id, "type": "function", "function": function}
            arguments = {"index": index, "function": {"arguments": event.arguments}}
            deltas += [{"tool_calls": [header]}, {"tool_calls": [arguments]}]
        return deltas

    def opening(self) -> dict[str, object] | None:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def piece(self, text: str, entries: list[TokenEntry]) -> list[dict[str, object]]:
        deltas = self._deltas(self.parser.push(text))
        if not (self.logprobs and entries):
            return [self._chunk(delta, None) for delta in deltas]
        logprobs = chat_logprobs(entries)
        first, rest = (deltas[0], deltas[1:]) if deltas else ({}, [])
        return [self._chunk(first, None, logprobs)] + [self._chunk(d, None) for d in rest]

    def finish(self, finish_reason: str) -> list[dict[str, object]]:
        chunks = [self._chunk(delta, None) for delta in self._deltas(self.parser.finish())]
        reason = finish_reason_with_calls(finish_reason, self.parser.num_calls)
        return [*chunks, self._chunk({}, reason)]

    def final(self, text: str, entries: list[TokenEntry], finish_reason: str) -> dict[str, object]:
        parser = ToolCallParser(self.tool_format, self.names)
        events = parser.push(text) + parser.finish()
        calls = [e for e in events if isinstance(e, ToolCall)]
        content: str | None = "".join(e for e in events if isinstance(e, str))
        message: dict[str, object] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["content"] = (content or "").strip() or None
            message["tool_calls"] = [tool_call_dict(call) for call in calls]
        return {
            "index": self.index,
            "message": message,
            "logprobs": chat_logprobs(entries) if self.logprobs else None,
            "finish_reason": finish_reason_with_calls(finish_reason, len(calls)),
        }
