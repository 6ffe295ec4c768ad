"""Tools and tool history → what the chat template renders.

Owns `prepare_messages`: given template messages (assistant `tool_calls` in Hugging Face's
shape, arguments as objects; `tool` messages with `tool_call_id` and maybe `name`), the
`ToolFormat` and the request's `ToolPlan`, it returns the messages and the `tools` value
to hand to `ChatTemplate.render`.

- Native formats (hermes, llama3, mistral): everything passes through; the template
  renders `tools`, `tool_calls` and `tool` messages itself.
- The generic format (templates without tool support): the template never sees a tool.
  The tool list and the call syntax go into the system message (`generic_tool_prompt`,
  appended to the client's first system message or added as one); an assistant turn's
  calls become `<tool_call>` blocks after its text; tool results become a `user` turn of
  `<tool_response>` blocks (consecutive results share one turn), a role every template
  accepts (Gemma's fallback has no system or tool role; SmolLM2's ChatML has no tool role).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from inferflux.api.tools.formats import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolFormat
from inferflux.api.tools.protocol import ToolPlan

TemplateMessage = dict[str, object]

_GENERIC_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_GENERIC_CALL_SYNTAX = (
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)


def generic_tool_prompt(plan: ToolPlan) -> str:
    """The system-prompt block of the generic format (docs/api.md shows it)."""
    lines = [json.dumps(f.as_tool(), ensure_ascii=False) for f in plan.functions]
    text = _GENERIC_HEADER + "\n".join(lines) + "\n" + _GENERIC_CALL_SYNTAX
    if plan.forced is not None:
        text += f"\n\nYou must call the function '{plan.forced}'."
    elif plan.required:
        text += "\n\nYou must call at least one function."
    if not plan.parallel:
        text += "\nCall at most one function."
    return text


def generic_call_text(name: str, arguments: object) -> str:
    """One call as the generic format writes it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _calls_text(calls: object) -> list[str]:
    texts = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        if isinstance(function, Mapping):
            texts.append(generic_call_text(str(function.get("name")), function.get("arguments")))
    return texts


def _generic_history(messages: Sequence[Mapping[str, object]]) -> list[TemplateMessage]:
    out: list[TemplateMessage] = []
    for message in messages:
        role, content = message.get("role"), str(message.get("content") or "")
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            previous = out[-1] if out else None
            if previous is not None and previous.get("_tool_results"):
                previous["content"] = f"{previous['content']}\n{block}"
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        elif role == "assistant" and message.get("tool_calls"):
            parts = [content] if content else []
            parts += _calls_text(message.get("tool_calls"))
            out.append({"role": "assistant", "content": "\n".join(parts)})
        else:
            out.append({k: v for k, v in message.items() if k != "tool_calls"})
    for message in out:
        message.pop("_tool_results", None)
    return out


def _with_system_block(messages: list[TemplateMessage], block: str) -> list[TemplateMessage]:
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{block}".lstrip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def prepare_messages(
    messages: Sequence[Mapping[str, object]], tool_format: ToolFormat, plan: ToolPlan | None
) -> tuple[list[TemplateMessage], list[dict[str, object]] | None]:
    """(messages, tools) for `ChatTemplate.render` (module docstring); tools is None when
    the template must not see any."""
    if tool_format.native:
        tools = [f.as_tool() for f in plan.functions] if plan is not None else None
        return [dict(m) for m in messages], tools
    history = _generic_history(messages)
    if plan is None:
        return history, None
    return _with_system_block(history, generic_tool_prompt(plan)), None
