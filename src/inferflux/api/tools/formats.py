"""How a model writes tool calls: one `ToolFormat` per chat-template family.

Owns the table of formats and `detect_tool_format`, which picks one from the chat
template's source text. Does not own rendering (`prompt.py`), parsing (`parser.py`) or the
grammar that constrains generation (`grammar.py`); they all read a `ToolFormat`.

- hermes (Hermes 2/3, Qwen 2/2.5/3; the template mentions `<tool_call>`):
  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call.
- llama3 (Llama 3.1-3.3; `<|python_tag|>`, or `<|start_header_id|>` and `tools`):
  `{"name": ..., "parameters": {...}}`, one call per turn.
- mistral (`[TOOL_CALLS]`): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
- generic (every other template, and the built-in fallbacks): like hermes.

Native formats (`native=True`) get `tools`, assistant `tool_calls` and `tool` messages
passed to the template, which renders them its own way. The generic format renders them
as text (see `prompt.py`), so it works with any template, including SmolLM2's ChatML and
the Gemma fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class Opener:
    """Text that starts a tool call. `in_body`: the text is the start of the JSON body
    itself (llama3's `{"name"`), not a marker before it."""

    text: str
    in_body: bool = False


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """One family's tool-call syntax.

    `openers`: what starts a call (the first is the grammar's trigger); `close`: what ends
    it, or None when the JSON body ends it. `args_key`: the key of the arguments object.
    `array_body`: the body is a JSON array of calls (mistral). `native`: the template
    renders tools itself. `parallel`: the format can carry several calls in one turn.
    """

    name: str
    openers: tuple[Opener, ...]
    close: str | None
    args_key: str
    native: bool
    array_body: bool = False
    parallel: bool = True

    @property
    def trigger(self) -> str:
        """The text that starts a call in the grammar (and in the prompt's instructions)."""
        return self.openers[0].text


TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

HERMES = ToolFormat("hermes", (Opener(TOOL_CALL_OPEN),), TOOL_CALL_CLOSE, "arguments", native=True)
GENERIC = ToolFormat(
    "generic", (Opener(TOOL_CALL_OPEN),), TOOL_CALL_CLOSE, "arguments", native=False
)
LLAMA3 = ToolFormat(
    "llama3",
    (Opener('{"name"', in_body=True), Opener("<|python_tag|>")),
    None,
    "parameters",
    native=True,
    parallel=False,
)
MISTRAL = ToolFormat(
    "mistral",
    (Opener("[TOOL_CALLS]"), Opener('[{"name"', in_body=True)),
    None,
    "arguments",
    native=True,
    array_body=True,
)
TOOL_FORMATS = {f.name: f for f in (HERMES, LLAMA3, MISTRAL, GENERIC)}


@lru_cache(maxsize=8)
def detect_tool_format(template_source: str, *, is_fallback: bool = False) -> ToolFormat:
    """The tool-call format of a chat template (see the module table). A built-in
    fallback template, or a template without tool support, gets GENERIC."""
    if is_fallback:
        return GENERIC
    if "[TOOL_CALLS]" in template_source:
        return MISTRAL
    if TOOL_CALL_OPEN in template_source:
        return HERMES
    llama_header = "<|start_header_id|>" in template_source and "tools" in template_source
    if "<|python_tag|>" in template_source or llama_header:
        return LLAMA3
    return GENERIC
