"""Tools and tool history through real chat templates: native families and the generic
prompt (SmolLM2's ChatML and the Gemma fallback)."""

from __future__ import annotations

import json

from inferflux.api.tools.formats import GENERIC, HERMES, LLAMA3
from inferflux.api.tools.prompt import generic_tool_prompt, prepare_messages
from inferflux.api.tools.protocol import FunctionSpec, ToolPlan
from inferflux.engine.chat_template import GEMMA_TEMPLATE, ChatTemplate
from tests.unit.api.tools.templates import LLAMA31, QWEN25, SMOLLM2

WEATHER = FunctionSpec(
    "get_weather",
    "Current weather of a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
PLAN = ToolPlan((WEATHER,), required=False, forced=None, parallel=True)
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}
HISTORY: list[dict[str, object]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call_1"},
    {"role": "tool", "content": '{"humidity": 40}', "tool_call_id": "call_2"},
]


def render(source: str, *, architecture: str = "llama", fallback: bool = False) -> str:
    fmt = GENERIC if fallback else None
    template = ChatTemplate.from_model(None if fallback else source, architecture, "<s>", "</s>")
    messages, tools = prepare_messages(HISTORY, fmt or _native(source), PLAN)
    return template.render(messages, tools=tools)


def _native(source: str) -> object:
    return HERMES if source is QWEN25 else LLAMA3 if source is LLAMA31 else GENERIC


def test_generic_prompt_lists_tools_and_the_call_syntax() -> None:
    text = generic_tool_prompt(PLAN)
    assert json.dumps(WEATHER.as_tool()) in text
    assert "<tool_call>" in text and "</tool_call>" in text
    forced = generic_tool_prompt(ToolPlan((WEATHER,), True, "get_weather", False))
    assert "You must call the function 'get_weather'" in forced
    assert "at most one" in forced


def test_generic_history_through_smollm2_chatml() -> None:
    text = render(SMOLLM2)
    assert text.startswith("<|im_start|>system\n# Tools")  # replaces SmolLM2's default system
    assert "You are a helpful AI assistant named SmolLM" not in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather"' in text
    # both results in one user turn, in order
    assert text.count("<|im_start|>user") == 2
    assert '<tool_response>\n{"temp_c": 21}\n</tool_response>\n<tool_response>' in text
    assert "<|im_start|>tool" not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_generic_history_through_the_gemma_fallback() -> None:
    text = render("", architecture="gemma3", fallback=True)
    assert ChatTemplate.from_model(None, "gemma3", "", "").source == GEMMA_TEMPLATE
    assert text.startswith("<s><start_of_turn>user\n# Tools")  # system folded into user
    assert "<start_of_turn>model\n<tool_call>" in text
    assert "<tool_response>" in text
    assert text.endswith("<start_of_turn>model\n")


def test_client_system_message_keeps_its_text_and_gains_the_block() -> None:
    history = [{"role": "system", "content": "Be terse."}, *HISTORY[:1]]
    messages, tools = prepare_messages(history, GENERIC, PLAN)
    assert tools is None and len(messages) == 2
    assert str(messages[0]["content"]).startswith("Be terse.\n\n# Tools")


def test_generic_without_a_plan_still_renders_tool_history_as_text() -> None:
    messages, tools = prepare_messages(HISTORY, GENERIC, None)
    assert tools is None
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "# Tools" not in json.dumps(messages)


def test_qwen_template_renders_tools_calls_and_results_natively() -> None:
    text = render(QWEN25)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<|im_start|>user\n<tool_response>\n" in text


def test_llama31_template_renders_the_call_as_json() -> None:
    text = render(LLAMA31)
    assert "Environment: ipython" in text
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in text
    assert "<|start_header_id|>ipython<|end_header_id|>" in text
