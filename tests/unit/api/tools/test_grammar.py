"""The text of tool-call grammars (that llguidance accepts them and what they match is
checked against a real vocabulary in tests/integration/test_tool_grammar.py)."""

from __future__ import annotations

import json

from inferflux.api.tools.formats import GENERIC, LLAMA3, MISTRAL
from inferflux.api.tools.grammar import call_schema, tool_call_grammar
from inferflux.api.tools.protocol import FunctionSpec, ToolPlan

A = FunctionSpec("a", None, {"type": "object", "properties": {"x": {"type": "integer"}}})
B = FunctionSpec("b", None, {"type": "object", "properties": {}})


def test_one_function_is_one_object_schema_with_name_first() -> None:
    schema = call_schema(GENERIC, (A,))
    assert list(schema["properties"]) == ["name", "arguments"]  # type: ignore[call-overload]
    assert schema["properties"]["name"] == {"const": "a"}  # type: ignore[index]
    assert schema["additionalProperties"] is False
    assert "anyOf" in call_schema(LLAMA3, (A, B))
    assert "parameters" in json.dumps(call_schema(LLAMA3, (A,)))


def test_required_has_no_free_text_and_auto_has_a_lazy_trigger() -> None:
    required = tool_call_grammar(GENERIC, ToolPlan((A, B), True, None, True))
    assert required.startswith("%llguidance {}\nstart: call")
    assert "TEXT" not in required and '("\\n" call)*' in required
    auto = tool_call_grammar(GENERIC, ToolPlan((A, B), False, None, False))
    assert 'trigger[lazy]: TEXT "<tool_call>"' in auto
    assert "start: TEXT | first\n" in auto  # one call at most


def test_a_named_choice_constrains_to_that_function_only() -> None:
    grammar = tool_call_grammar(GENERIC, ToolPlan((A, B), True, "b", True))
    assert '"const": "b"' in grammar and '"const": "a"' not in grammar


def test_special_tags_are_unquoted() -> None:
    grammar = tool_call_grammar(GENERIC, ToolPlan((A,), True, None, True), special_tags=True)
    assert 'call: <tool_call> "\\n" body "\\n" </tool_call>' in grammar


def test_mistral_bounds_the_array_when_calls_are_not_parallel() -> None:
    assert '"maxItems": 1' in tool_call_grammar(MISTRAL, ToolPlan((A,), True, None, False))
    assert "maxItems" not in tool_call_grammar(MISTRAL, ToolPlan((A,), True, None, True))
