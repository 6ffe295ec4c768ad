"""Pydantic models of tool definitions and tool choices (the HTTP edge), and the
`ToolPlan` a request's tool fields resolve to.

Owns: the OpenAI shapes `tools[]` (`{"type": "function", "function": {name, description,
parameters, strict}}`), `tool_choice` (`"none"`, `"auto"`, `"required"` or
`{"type": "function", "function": {"name"}}`), assistant `tool_calls[]` in history, and
`resolve_tools`, which checks them together (a named choice must name a tool, names are
unique, each `parameters` is a valid JSON Schema of an object) and returns the plan, or
None when no tool may be called. Ollama's `tools` have the same shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from inferflux.api.structured import check_schema
from inferflux.errors import InvalidRequest

MAX_TOOLS = 128
FUNCTION_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FunctionDefinition(_Strict):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: bool | None = None  # accepted: calls are always constrained to the schema


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolCallFunction(_Strict):
    name: str
    arguments: str


class AssistantToolCall(_Strict):
    """One call of an assistant message sent back as history (OpenAI's shape)."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """A function the model may call. `parameters`: a JSON Schema of an object."""

    name: str
    description: str | None
    parameters: dict[str, object]

    def as_tool(self) -> dict[str, object]:
        """OpenAI's tool object (what templates and the generic prompt show the model)."""
        function: dict[str, object] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request lets the model do with tools.

    `functions`: every tool (all are shown to the model); `required`: it must call one;
    `forced`: the one function it must call, exactly once (a named tool_choice), else
    None; `parallel`: it may make several calls in one turn.
    """

    functions: tuple[FunctionSpec, ...]
    required: bool
    forced: str | None
    parallel: bool

    def callable_functions(self) -> tuple[FunctionSpec, ...]:
        if self.forced is None:
            return self.functions
        return tuple(f for f in self.functions if f.name == self.forced)

    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.callable_functions())


def _parameters(definition: FunctionDefinition, param: str) -> dict[str, object]:
    schema: dict[str, object] = dict(definition.parameters or {"type": "object", "properties": {}})
    if schema.get("type", "object") != "object":
        raise InvalidRequest(
            f"the parameters of '{definition.name}' must be a JSON Schema of type 'object'",
            param=param,
        )
    check_schema(schema, param)  # the metaschema check every JSON schema gets
    return schema


# (schema, param) → raises InvalidRequest when the schema is too deep or too large
BoundsCheck = Callable[[object, str], object]


def function_specs(
    tools: list[ToolDefinition], param: str = "tools", check_bounds: BoundsCheck | None = None
) -> tuple[FunctionSpec, ...]:
    """The functions of `tools`; InvalidRequest for duplicates, schemas out of bounds
    (`check_bounds`, run before any recursive validator) and invalid schemas."""
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"at most {MAX_TOOLS} tools are allowed", param=param)
    specs: list[FunctionSpec] = []
    for index, tool in enumerate(tools):
        function = tool.function
        if any(spec.name == function.name for spec in specs):
            raise InvalidRequest(
                f"two tools are named '{function.name}'; tool names must be unique",
                param=f"{param}[{index}].function.name",
            )
        schema_param = f"{param}[{index}].function.parameters"
        if check_bounds is not None and function.parameters is not None:
            check_bounds(function.parameters, schema_param)
        schema = _parameters(function, schema_param)
        specs.append(FunctionSpec(function.name, function.description, schema))
    return tuple(specs)


def resolve_tools(
    tools: list[ToolDefinition] | None,
    tool_choice: ToolChoice | None,
    parallel_tool_calls: bool | None,
    *,
    check_bounds: BoundsCheck | None = None,
) -> ToolPlan | None:
    """The plan of a request's tool fields, None when the model may call nothing (no
    tools, or tool_choice "none"). Raises InvalidRequest naming the field at fault."""
    specs = function_specs(tools or [], check_bounds=check_bounds)
    if not specs:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice needs a non-empty 'tools' list", param="tool_choice")
        return None
    if tool_choice == "none":
        return None
    forced = tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else None
    if forced is not None and all(spec.name != forced for spec in specs):
        raise InvalidRequest(
            f"tool_choice names the function '{forced}', which is not in 'tools'",
            param="tool_choice",
        )
    required = forced is not None or tool_choice == "required"
    # NOTE: a named function is called once, as OpenAI does (also keeps small models from
    # calling it again and again until max_tokens)
    parallel = parallel_tool_calls is not False and forced is None
    return ToolPlan(specs, required, forced, parallel)
