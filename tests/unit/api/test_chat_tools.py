"""OpenAI tool-call shapes of a chat choice: streamed deltas and the whole message, over
the parts the generation service's tool-call parser reads out of the text."""

from __future__ import annotations

import json

from inferflux.api.generation import Choice, ChoiceResult, Part
from inferflux.api.openai.chat_tools import ToolChatChoice
from inferflux.api.tools import ToolCallParser
from inferflux.api.tools.formats import GENERIC
from inferflux.api.tools.protocol import FunctionSpec, ToolPlan
from inferflux.engine.messages import AddRequest, FinishReason, SamplingParams

PLAN = ToolPlan(
    (FunctionSpec("get_weather", None, {"type": "object"}), FunctionSpec("f", None, {})),
    required=False,
    forced=None,
    parallel=True,
)
TEXT = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
)


def parser() -> ToolCallParser:
    return ToolCallParser(GENERIC, PLAN.names())


def result(finish_reason: str, parts: list[Part], num_calls: int) -> ChoiceResult:
    add = AddRequest(request_id="r", prompt_token_ids=[1], sampling=SamplingParams(max_tokens=8))
    return ChoiceResult(
        Choice(0, 0, add), FinishReason(finish_reason), 0, 0, [], num_calls, parts=parts
    )


class Choice_:
    """A choice's renderer fed as the service feeds it (the parser in front)."""

    def __init__(self) -> None:
        self.renderer = ToolChatChoice(0, logprobs=False)
        self.parser = parser()

    def piece(self, text: str, entries: list) -> list[dict]:
        return self.renderer.piece(self.parser.push(text), entries)

    def finish(self, finish_reason: str) -> list[dict]:
        rest = self.parser.finish()
        return self.renderer.finish(rest, result(finish_reason, [], self.parser.num_calls))

    def final(self, text: str, entries: list, finish_reason: str) -> dict:
        whole = parser()
        parts = whole.push(text) + whole.finish()
        return self.renderer.final(result(finish_reason, parts, whole.num_calls))


def choice() -> Choice_:
    return Choice_()


def test_whole_message_has_calls_content_and_finish_reason() -> None:
    body = choice().final(TEXT, [], "stop")
    message = body["message"]
    assert body["finish_reason"] == "tool_calls"
    assert message["content"] == "Checking."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "f"]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_a_call_alone_has_null_content_and_length_stays_length() -> None:
    only = TEXT.split("\n", 1)[1]
    assert choice().final(only, [], "stop")["message"]["content"] is None
    assert choice().final(only, [], "length")["finish_reason"] == "length"
    plain = choice().final("Just text.", [], "stop")
    assert plain["message"] == {"role": "assistant", "content": "Just text.", "refusal": None}
    assert plain["finish_reason"] == "stop"


def test_streamed_deltas_accumulate_like_the_sdk() -> None:
    renderer = choice()
    chunks = []
    for start in range(0, len(TEXT), 7):  # 7-character pieces split every tag
        chunks += renderer.piece(TEXT[start : start + 7], [])
    chunks += renderer.finish("stop")
    content = "".join(c["delta"].get("content", "") for c in chunks)
    assert content == "Checking."
    assert "<tool" not in json.dumps(chunks)
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for part in chunk["delta"].get("tool_calls", []):
            call = calls.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
            call["id"] += part.get("id", "")
            call["name"] += part.get("function", {}).get("name", "")
            call["arguments"] += part.get("function", {}).get("arguments", "")
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "f"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"] != calls[1]["id"]
    headers = [p for c in chunks for p in c["delta"].get("tool_calls", []) if "id" in p]
    assert all(h["type"] == "function" and h["function"]["arguments"] == "" for h in headers)
    assert chunks[-1]["finish_reason"] == "tool_calls" and chunks[-1]["delta"] == {}
    assert all(c["finish_reason"] is None for c in chunks[:-1])
