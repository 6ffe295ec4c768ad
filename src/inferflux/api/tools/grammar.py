"""The llguidance (Lark) grammar that constrains a generation to valid tool calls.

Owns `tool_call_grammar(format, plan)`. Each call's JSON is a `%json` schema: an object
whose `name` is the function's name (`const`) and whose arguments key (`arguments`, or
`parameters` for llama3) is the function's own `parameters` schema; several functions
are an `anyOf`. Property order is the schema's, so `name` always comes first.

- `required` / a named function: the output is calls only, from the first token.
- `auto`: free text, until the model writes the format's trigger (`<tool_call>`,
  `[TOOL_CALLS]`, or `{"name": "` for llama3); from there the call is constrained. The
  trigger is an llguidance lazy lexeme (`trigger[lazy]: TEXT "<tool_call>"`, the pattern
  of llguidance's `StructTag`), matched as soon as it appears in the text.
- `parallel_tool_calls: false`: one call, then the grammar is complete and the request
  stops. Otherwise more calls may follow, separated by a newline (or, mistral, inside one
  JSON array).
"""

from __future__ import annotations

import json

from inferflux.api.tools.formats import LLAMA3, ToolFormat
from inferflux.api.tools.protocol import FunctionSpec, ToolPlan

_TEXT = "TEXT: /(.|\\n)*/"
_LLAMA3_TRIGGER = '{"name": "'
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _lark_string(text: str) -> str:
    return json.dumps(text)


def call_schema(tool_format: ToolFormat, functions: tuple[FunctionSpec, ...]) -> dict[str, object]:
    """The JSON schema of one call (any of `functions`)."""
    options: list[dict[str, object]] = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, tool_format.args_key: f.parameters},
            "required": ["name", tool_format.args_key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _json(schema: dict[str, object]) -> str:
    """`%json` with the layout the models write: `", "` and `": "`, no free whitespace
    (tiny models otherwise emit whitespace until max_tokens; the same layout as
    `engine/grammar.py` uses for response_format)."""
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_LAYOUT}, ensure_ascii=False)


def _tagged(tool_format: ToolFormat, plan: ToolPlan, *, special: bool) -> str:
    """hermes and generic: `<tool_call>\\n{json}\\n</tool_call>` blocks. `special`: the
    tags are single special tokens of the vocabulary (Qwen's), written `<tool_call>`
    unquoted in Lark; otherwise they are text, and auto mode needs a lazy trigger."""
    open_tag, close_tag = tool_format.trigger, tool_format.close or ""
    if special:
        opening, closing = f'{open_tag} "\\n"', f'"\\n" {close_tag}'
    else:
        opening, closing = _lark_string(open_tag + "\n"), _lark_string("\n" + close_tag)
    rules = [
        f"body: {_json(call_schema(tool_format, plan.callable_functions()))}",
        f"call: {opening} body {closing}",
    ]
    more = ' ("\\n" call)*' if plan.parallel else ""
    if plan.required:
        return "\n".join([f"start: call{more}", *rules])
    if special:
        first = [f"first: TEXT {opening} body {closing}"]
    else:
        trigger = f"trigger[lazy]: TEXT {_lark_string(open_tag)}"
        first = [f'first: trigger "\\n" body {closing}', trigger]
    return "\n".join([f"start: TEXT | first{more}", *rules, *first, _TEXT])


def _llama3_rest(tool_format: ToolFormat, function: FunctionSpec) -> str:
    """What follows llama3's trigger `{"name": "` for one function."""
    after_name = function.name + '", ' + json.dumps(tool_format.args_key) + ": "
    return f'{_lark_string(after_name)} {_json(function.parameters)} "}}"'


def _llama3(tool_format: ToolFormat, plan: ToolPlan) -> str:
    """llama3: one bare JSON object; in auto mode triggered by `{"name": "`."""
    functions = plan.callable_functions()
    if plan.required:
        return f"start: {_json(call_schema(tool_format, functions))}"
    rests = [_llama3_rest(tool_format, f) for f in functions]
    return "\n".join(
        [
            "start: TEXT | trigger rest",
            f"rest: {' | '.join(rests)}",
            f"trigger[lazy]: TEXT {_lark_string(_LLAMA3_TRIGGER)}",
            _TEXT,
        ]
    )


def _mistral(tool_format: ToolFormat, plan: ToolPlan) -> str:
    """mistral: `[TOOL_CALLS]` then a JSON array of calls."""
    array: dict[str, object] = {
        "type": "array",
        "items": call_schema(tool_format, plan.callable_functions()),
        "minItems": 1,
    }
    if not plan.parallel:
        array["maxItems"] = 1
    body = f"body: {_json(array)}"
    if plan.required:
        return "\n".join([f"start: {_lark_string(tool_format.trigger)} body", body])
    return "\n".join(
        [
            "start: TEXT | trigger body",
            body,
            f"trigger[lazy]: TEXT {_lark_string(tool_format.trigger)}",
            _TEXT,
        ]
    )


def tool_call_grammar(
    tool_format: ToolFormat, plan: ToolPlan, *, special_tags: bool = False
) -> str:
    """The Lark grammar (llguidance dialect) for `plan` in `tool_format` (module docstring).
    `special_tags`: the format's `<...>` tags are single tokens of the vocabulary, which
    llguidance matches only as special tokens."""
    if tool_format.array_body:
        rules = _mistral(tool_format, plan)
    elif tool_format is LLAMA3 or tool_format.close is None:
        rules = _llama3(tool_format, plan)
    else:
        rules = _tagged(tool_format, plan, special=special_tags)
    return "%llguidance {}\n" + rules + "\n"
