"""Tool definitions and tool_choice resolved to a ToolPlan, or a 400 naming the field."""

from __future__ import annotations

import pytest

from inferflux.api.tools.protocol import NamedToolChoice, ToolDefinition, resolve_tools
from inferflux.errors import InvalidRequest


def tool(name: str, parameters: dict[str, object] | None = None) -> ToolDefinition:
    function: dict[str, object] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return ToolDefinition.model_validate({"type": "function", "function": function})


def named(name: str) -> NamedToolChoice:
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": name}})


TOOLS = [tool("a"), tool("b", {"type": "object", "properties": {"x": {"type": "integer"}}})]


def test_no_tools_or_none_means_no_plan() -> None:
    assert resolve_tools(None, None, None) is None
    assert resolve_tools([], "auto", True) is None
    assert resolve_tools(TOOLS, "none", None) is None


def test_auto_required_and_named() -> None:
    auto = resolve_tools(TOOLS, None, None)
    assert auto is not None and not auto.required and auto.parallel
    assert auto.names() == {"a", "b"}
    required = resolve_tools(TOOLS, "required", False)
    assert required is not None and required.required and not required.parallel
    forced = resolve_tools(TOOLS, named("b"), None)
    assert forced is not None and forced.required and forced.names() == {"b"}
    assert not forced.parallel  # a named function is called once
    assert [f.name for f in forced.functions] == ["a", "b"]  # all are still shown


def test_missing_parameters_mean_no_arguments() -> None:
    plan = resolve_tools([tool("a")], None, None)
    assert plan is not None
    assert plan.functions[0].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([], "required", "tool_choice"),
        (None, named("a"), "tool_choice"),
        (TOOLS, named("c"), "tool_choice"),
        ([tool("a"), tool("a")], None, "tools[1].function.name"),
        ([tool("a", {"type": "array"})], None, "tools[0].function.parameters"),
        ([tool("a", {"type": "object", "required": "x"})], None, "tools[0].function.parameters"),
    ],
)
def test_bad_tool_requests_name_the_param(
    tools: list[ToolDefinition] | None, choice: object, param: str
) -> None:
    with pytest.raises(InvalidRequest) as raised:
        resolve_tools(tools, choice, None)  # type: ignore[arg-type]
    assert raised.value.param == param
