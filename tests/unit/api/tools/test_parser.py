"""Reading tool calls out of text: whole, streamed in any chunking, and malformed."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from inferflux.api.tools.formats import GENERIC, HERMES, LLAMA3, MISTRAL, ToolFormat
from inferflux.api.tools.parser import ToolCall, ToolCallParser, json_value_end, parse_tool_calls

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def test_a_call_alone_has_no_content() -> None:
    content, [call] = parse_tool_calls(WEATHER, GENERIC)
    assert content == ""
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_") and len(call.id) == 29


def test_text_before_and_parallel_calls() -> None:
    content, calls = parse_tool_calls(f"Let me check.\n\n{WEATHER}\n{TIME}\n", HERMES)
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert len({c.id for c in calls}) == 2


def test_plain_text_is_untouched() -> None:
    text = "The <b>weather</b> is nice <tool and {braces}.\n"
    assert parse_tool_calls(text, GENERIC) == (text, [])


def test_malformed_bodies_are_plain_content() -> None:
    for body in ["{not json}", '{"arguments": {}}', '{"name": "f", "arguments": [1]}', "[]"]:
        text = f"<tool_call>\n{body}\n</tool_call>"
        assert parse_tool_calls(text, GENERIC) == (text, [])


def test_unknown_function_names_are_content_when_names_are_given() -> None:
    assert parse_tool_calls(WEATHER, GENERIC, names={"get_time"}) == (WEATHER, [])
    assert parse_tool_calls(WEATHER, GENERIC, names={"get_weather"})[1]


def test_an_unfinished_call_is_dropped_not_returned_as_text() -> None:
    parser = ToolCallParser(GENERIC)
    events = parser.push('Sure <tool_call>\n{"name": "get_weather", "argu') + parser.finish()
    assert events == ["Sure"] and parser.truncated


def test_arguments_as_a_json_string_are_accepted() -> None:
    text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    [call] = parse_tool_calls(text, GENERIC)[1]
    assert json.loads(call.arguments) == {"a": 1}


def test_llama3_bare_json_and_python_tag() -> None:
    text = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    content, [call] = parse_tool_calls(text, LLAMA3)
    assert content == "" and json.loads(call.arguments) == {"city": "Oslo"}
    tagged = '<|python_tag|>{"name": "f", "parameters": {}}'
    assert [c.name for c in parse_tool_calls(tagged, LLAMA3)[1]] == ["f"]
    assert parse_tool_calls('{"name" is a key}', LLAMA3) == ('{"name" is a key}', [])


def test_mistral_array_with_or_without_the_marker() -> None:
    body = '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]'
    for text in (f"[TOOL_CALLS]{body}", body):
        content, calls = parse_tool_calls(text, MISTRAL)
        assert content == "" and [c.name for c in calls] == ["a", "b"]


def test_held_back_text_is_released_when_it_is_not_a_call() -> None:
    parser = ToolCallParser(GENERIC)
    assert parser.push("a <tool_") == ["a"]
    assert parser.push("box> b") == [" <tool_box> b"]
    assert parser.finish() == []


def test_json_value_end() -> None:
    assert json_value_end(' {"a": "}"} tail', 0) == 11
    assert json_value_end('{"a": [1, {"b": "\\""}]}', 0) == 23
    assert json_value_end('{"a": ', 0) is None
    assert json_value_end("   ", 0) is None


def _events(fmt: ToolFormat, pieces: list[str]) -> list[object]:
    """Events with ids dropped and adjacent texts merged."""
    parser = ToolCallParser(fmt)
    raw = [e for piece in pieces for e in parser.push(piece)] + parser.finish()
    merged: list[object] = []
    for event in raw:
        if isinstance(event, ToolCall):
            merged.append((event.name, event.arguments))
        elif merged and isinstance(merged[-1], str):
            merged[-1] += event
        else:
            merged.append(event)
    return merged


SEGMENTS = st.sampled_from(
    [
        WEATHER,
        TIME,
        "\n",
        " ",
        "Hello",
        "<tool",
        "<tool_call>{broken</tool_call>",
        "</tool_call>",
        '{"name": "x"}',
        "ü€",
        "<tool_call>\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(SEGMENTS, max_size=8), st.data())
def test_events_do_not_depend_on_the_chunking(segments: list[str], data: st.DataObject) -> None:
    text = "".join(segments)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert _events(GENERIC, pieces) == _events(GENERIC, [text])
    assert _events(LLAMA3, pieces) == _events(LLAMA3, [text])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.data())
def test_text_without_calls_comes_back_whole(text: str, data: st.DataObject) -> None:
    if "<tool_call>" in text:
        return
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    parser = ToolCallParser(GENERIC)
    events = [e for piece in pieces for e in parser.push(piece)] + parser.finish()
    assert "".join(str(e) for e in events) == text
