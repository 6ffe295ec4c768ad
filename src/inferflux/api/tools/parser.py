"""Reading tool calls out of generated text, whole or as it streams.

Owns `ToolCall` (one parsed call, arguments as a JSON string as OpenAI sends them) and
`ToolCallParser`, an incremental parser: `push(text)` as text arrives, `finish()` at the
end; each returns events, in order: plain text (`str`) or a complete `ToolCall`.

How it reads (for a `ToolFormat` from `formats.py`):

- Outside a call, text is released at once, except a tail that may be the start of an
  opener (`<tool_c` could become `<tool_call>`) and trailing whitespace: both are held
  until the next text decides. Whitespace right before a call is dropped, so a message
  never ends in the blank line the model wrote before its call.
- Inside a call, nothing is released until the call is complete: its close tag arrived
  (`</tool_call>`), or, for formats without one, its JSON body is balanced. The body is
  then parsed; a body that is not valid JSON, names no function or an unknown one, or has
  arguments that are not an object is released as the plain text it was. Malformed output
  is content, never an error.
- `finish()` drops an unfinished call (the model ran out of tokens: the finish_reason,
  `length`, says so) and sets `truncated`: call markup is never returned as content.

The events do not depend on how the text was split into pushes (a property test checks
this over arbitrary chunkings).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from inferflux.api.tools.formats import Opener, ToolFormat


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: `arguments` is JSON text of an object."""

    id: str
    name: str
    arguments: str

    def arguments_object(self) -> dict[str, object]:
        value = json.loads(self.arguments)
        return value if isinstance(value, dict) else {}


Event = str | ToolCall


def new_call_id() -> str:
    """An OpenAI-style call id: `call_` and 24 random hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


def json_value_end(text: str, start: int) -> int | None:
    """The index just past the JSON object or array that starts at `text[start]` (after
    whitespace), None while it is incomplete. Raises ValueError when no object or array
    starts there. Only brackets are balanced; `json.loads` validates the rest."""
    position = start
    while position < len(text) and text[position].isspace():
        position += 1
    if position == len(text):
        return None
    if text[position] not in "{[":
        raise ValueError("a tool call body must be a JSON object or array")
    return _balanced_end(text, position)


def _balanced_end(text: str, position: int) -> int | None:
    depth, in_string, escaped = 0, False, False
    for index in range(position, len(text)):
        char = text[index]
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def _held_prefix(text: str, openers: Iterable[Opener]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of an opener."""
    longest = 0
    for opener in openers:
        for size in range(min(len(opener.text) - 1, len(text)), longest, -1):
            if opener.text.startswith(text[-size:]):
                longest = size
                break
    return longest


def _arguments(raw: object) -> dict[str, object] | None:
    if raw is None:
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, dict) else None


class ToolCallParser:
    """Incremental tool-call parser for one generation (module docstring). Not
    thread-safe; one instance per choice."""

    def __init__(self, tool_format: ToolFormat, names: Iterable[str] | None = None) -> None:
        self.format = tool_format
        self.names = frozenset(names) if names is not None else None
        self.num_calls = 0
        self.truncated = False  # the generation ended inside a call (max_tokens)
        self._buffer = ""
        self._opener: Opener | None = None  # set while inside a call
        self._whitespace = ""  # trailing whitespace of released text, held

    def push(self, text: str) -> list[Event]:
        """Events released by `text` (the next piece of the generation)."""
        self._buffer += text
        events: list[Event] = []
        while self._buffer:
            released = self._step_call() if self._opener else self._step_text()
            if released is None:
                break
            events.extend(released)
        return events

    def finish(self) -> list[Event]:
        """Everything still held: held text; an unfinished call is dropped (`truncated`)."""
        events: list[Event] = []
        if self._opener is not None:
            self._opener, self._buffer = None, ""
            self.truncated = True
        elif self._buffer:
            events.extend(self._text(self._buffer))
            self._buffer = ""
        if self._whitespace and not (self.num_calls or self.truncated):
            events.append(self._whitespace)
        self._whitespace = ""
        return events

    def _step_text(self) -> list[Event] | None:
        found = [
            (index, opener)
            for opener in self.format.openers
            if (index := self._buffer.find(opener.text)) >= 0
        ]
        if not found:
            keep = _held_prefix(self._buffer, self.format.openers)
            ready = self._buffer[: len(self._buffer) - keep]
            self._buffer = self._buffer[len(ready) :]
            return self._text(ready) if ready else None
        index, opener = min(found, key=lambda item: item[0])
        before = self._buffer[:index]
        skip = 0 if opener.in_body else len(opener.text)
        self._buffer = self._buffer[index + skip :]
        self._opener = opener
        return self._text(before)

    def _step_call(self) -> list[Event] | None:
        close = self.format.close or ""
        if close:
            end = self._buffer.find(close)
            if end < 0:
                return None
        else:
            try:
                found = json_value_end(self._buffer, 0)
            except ValueError:
                found = 0  # no JSON body: what followed the opener is plain text
            if found is None:
                return None
            end = found
        opener, body = self._opener, self._buffer[:end]
        self._buffer = self._buffer[end + len(close) :]
        self._opener = None
        calls = self._calls(body)
        if calls is None:
            prefix = "" if opener is None or opener.in_body else opener.text
            return self._text(prefix + body + close)
        self._whitespace = ""
        self.num_calls += len(calls)
        return list(calls)

    def _calls(self, body: str) -> list[ToolCall] | None:
        """The calls in one call body, or None when it is malformed."""
        try:
            value = json.loads(body)
        except ValueError:
            return None
        items = value if isinstance(value, list) else [value]
        if not items or (self.format.array_body and not isinstance(value, list)):
            return None
        calls = [self._call(item) for item in items]
        return None if any(call is None for call in calls) else [c for c in calls if c]

    def _call(self, item: object) -> ToolCall | None:
        if not isinstance(item, dict):
            return None
        name = item.get("name")
        if not isinstance(name, str) or not name:
            return None
        if self.names is not None and name not in self.names:
            return None
        raw = item.get(self.format.args_key, item.get("arguments", item.get("parameters")))
        arguments = _arguments(raw)
        if arguments is None:
            return None
        return ToolCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))

    def _text(self, text: str) -> list[Event]:
        """Release `text`, holding its trailing whitespace."""
        combined = self._whitespace + text
        stripped = combined.rstrip()
        self._whitespace = combined[len(stripped) :]
        return [stripped] if stripped else []


def parse_tool_calls(
    text: str, tool_format: ToolFormat, names: Iterable[str] | None = None
) -> tuple[str, list[ToolCall]]:
    """A whole generation: (its plain text, its calls)."""
    parser = ToolCallParser(tool_format, names)
    events = parser.push(text) + parser.finish()
    content = "".join(e for e in events if isinstance(e, str))
    return content, [e for e in events if isinstance(e, ToolCall)]
