"""Tool (function) calling, shared by the OpenAI and Ollama chat routes.

`formats` (which syntax a model's template uses), `protocol` (tool definitions and
choices at the edge, resolved to a `ToolPlan`), `prompt` (tools and tool history → the
template's input), `grammar` (the llguidance grammar of valid calls), `parser` (calls read
back out of the generated text, whole or streaming), `request` (all of it for one chat
request).
"""

from inferflux.api.tools.formats import ToolFormat, detect_tool_format
from inferflux.api.tools.grammar import tool_call_grammar
from inferflux.api.tools.parser import ToolCall, ToolCallParser, parse_tool_calls
from inferflux.api.tools.prompt import prepare_messages
from inferflux.api.tools.protocol import ToolPlan, resolve_tools
from inferflux.api.tools.request import ChatTools, plan_tools, tools_constraint

__all__ = [
    "ChatTools",
    "ToolCall",
    "ToolCallParser",
    "ToolFormat",
    "ToolPlan",
    "detect_tool_format",
    "parse_tool_calls",
    "plan_tools",
    "prepare_messages",
    "resolve_tools",
    "tool_call_grammar",
    "tools_constraint",
]
