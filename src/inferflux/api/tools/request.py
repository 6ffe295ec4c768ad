"""A chat request's tool setup, shared by the OpenAI and Ollama chat routes.

Owns `ChatTools` and `plan_tools`: from the template messages and the resolved
`ToolPlan`, pick the template's `ToolFormat`, prepare the template's input
(`prompt.py`) and build the grammar of valid calls (`grammar.py`); and
`tools_constraint`, that grammar compiled for the engine (`api/structured.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferflux.api.structured import OutputConstraint, grammar_constraint
from inferflux.api.tools.formats import ToolFormat, detect_tool_format
from inferflux.api.tools.grammar import tool_call_grammar
from inferflux.api.tools.prompt import prepare_messages
from inferflux.api.tools.protocol import ToolPlan
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.protocol import Tokenizer
from inferflux.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class ChatTools:
    """A chat request's tool setup: the format of the model's template, the plan (None:
    the model may not call a tool), the template's input, and the Lark grammar of valid
    calls (None without a plan)."""

    tool_format: ToolFormat
    plan: ToolPlan | None
    messages: list[dict[str, object]]
    template_tools: list[dict[str, object]] | None
    grammar: str | None


def plan_tools(
    messages: list[dict[str, object]],
    plan: ToolPlan | None,
    template: ChatTemplate,
    tokenizer: Tokenizer,
) -> ChatTools:
    """The tool setup of a chat request (OpenAI or Ollama) whose tool fields resolved to
    `plan`, over its template `messages`."""
    tool_format = detect_tool_format(template.source, is_fallback=template.is_fallback)
    if plan is not None and not tool_format.parallel:
        plan = ToolPlan(plan.functions, plan.required, plan.forced, parallel=False)
    messages, template_tools = prepare_messages(messages, tool_format, plan)
    grammar = None
    if plan is not None:
        special = _tags_are_tokens(tool_format, tokenizer)
        grammar = tool_call_grammar(tool_format, plan, special_tags=special)
    return ChatTools(tool_format, plan, messages, template_tools, grammar)


def _tags_are_tokens(tool_format: ToolFormat, tokenizer: Tokenizer) -> bool:
    """True when the format's `<...>` open and close tags are single vocabulary tokens
    (Qwen's `<tool_call>`): llguidance then matches them only as special tokens."""
    tags = [tool_format.trigger, tool_format.close or ""]
    if not all(tag.startswith("<") and tag.endswith(">") for tag in tags):
        return False
    return all(
        len(tokenizer.tokenize(tag, add_special=False, parse_special=True)) == 1 for tag in tags
    )


async def tools_constraint(
    tools: ChatTools, output: OutputConstraint | None, compiler: ConstraintCompiler
) -> OutputConstraint | None:
    """The engine constraint of a request that may call tools: the compiled grammar of
    valid calls. Raises InvalidRequest when the request also constrains its output
    (`response_format` JSON or `grammar`): a reply cannot be both."""
    if output is not None:
        raise InvalidRequest(
            "tools cannot be combined with a JSON response_format or a grammar; send "
            'tool_choice "none" or leave the tools out',
            param="tools",
        )
    if tools.grammar is None:
        return None
    return await grammar_constraint(compiler, tools.grammar, "lark", "tools")
