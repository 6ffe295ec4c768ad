"""Pydantic models of OpenAI's Responses API request (`POST /v1/responses`) and its
mapping to the generation service's terms.

Owns: the request shape (`ResponsesRequest`), the input items it takes (`message` with
text content, `function_call`, `function_call_output`; an item without `type` is a
message, as in OpenAI's "easy input"), `tools` (functions) and `tool_choice`,
`text.format` (`text`, `json_object`, `json_schema` through the constraint engine),
sampling (`max_output_tokens`, `temperature`, `top_p`), and turning a conversation (the
stored history of `previous_response_id` followed by this request's input) into the chat
template's messages (`template_messages`).

Strict like the other dialects: unknown fields and wrong JSON types are a 400 naming the
field. Accepted and ignored: `user`, `safety_identifier`, `prompt_cache_key` (the prefix
cache is automatic), `service_tier`, `stream_options`, `text.verbosity`. Refused with a 400
naming the field: files and audio, reasoning items and a
`reasoning` effort, built-in tools (`web_search`, `file_search`, ...), `background`,
`conversation`, `prompt` templates, `truncation: "auto"`, `include`, `top_logprobs`,
`max_tool_calls`. A user message's `input_image` parts (`image_url`: a data URI or an
http(s) URL) stand where they are (api/images; a model without an mmproj answers 400).
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, Tag, TypeAdapter

from inferflux.api.generation.spec import JsonOutput
from inferflux.api.images import ImageRef, ImageSet, take_image, url_ref
from inferflux.api.tools.protocol import (
    FUNCTION_NAME_PATTERN,
    BoundsCheck,
    FunctionDefinition,
    NamedToolChoice,
    ToolChoice,
    ToolDefinition,
    ToolPlan,
    resolve_tools,
)
from inferflux.engine.messages import Priority, SamplingParams
from inferflux.errors import InvalidRequest

MAX_INPUT_ITEMS = 4096
MAX_TOOLS = 128
MAX_METADATA = 16
ID_PATTERN = r"^[A-Za-z0-9_-]{1,128}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[JsonValue] | None = None
    logprobs: list[JsonValue] | None = None


class Refusal(_Strict):
    type: Literal["refusal"]
    refusal: str


class InputImage(_Strict):
    """An image of a user message: `image_url` a data URI or an http(s) URL (api/images);
    `file_id` (the Files API) is refused, this server keeps no files."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the mmproj decides

    def image_ref(self, param: str) -> ImageRef:
        """The image. Raises InvalidRequest for a file_id, no image_url or a bad one."""
        if self.image_url is None:
            raise InvalidRequest(
                "an input_image needs an image_url (a data URI or an http(s) URL); "
                "file_id is not supported",
                param=f"{param}.image_url",
            )
        return url_ref(self.image_url, f"{param}.image_url")


class UnsupportedContent(_Strict):
    """Content this server cannot take (a 400 naming it)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["input_file", "input_audio"]


Content = Annotated[
    InputText | InputImage | OutputText | Refusal | UnsupportedContent,
    Field(discriminator="type"),
]


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Content]
    id: str | None = None
    status: str | None = None

    def text(self, param: str = "input", images: ImageSet | None = None) -> str:
        """The content as one string; an input_image becomes `images.marker`, its image
        added to `images`. Raises InvalidRequest for an image where none are taken
        (`images` None), on a non-user message, or a malformed one."""
        if isinstance(self.content, str):
            return self.content
        pieces = []
        for position, part in enumerate(self.content):
            if not isinstance(part, InputImage):
                pieces.append(_content_text(part))
                continue
            pieces.append(
                take_image(images, self.role, f"{param}.content[{position}]", part.image_ref)
            )
        return "".join(pieces)


def _content_text(part: InputText | OutputText | Refusal | UnsupportedContent) -> str:
    if isinstance(part, InputText | OutputText):
        return part.text
    return part.refusal if isinstance(part, Refusal) else ""


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


class UnsupportedItem(_Strict):
    """Items this server never produces and cannot take (a 400 naming them)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


def _item_tag(value: object) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "")
    supported = ("message", "function_call", "function_call_output")
    return kind if kind in supported else "unsupported"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[UnsupportedItem, Tag("unsupported")],
    Discriminator(_item_tag),
]
InputItems = Annotated[list[InputItem], Field(max_length=MAX_INPUT_ITEMS)]
ConversationItem = MessageItem | FunctionCallItem | FunctionCallOutputItem
_ITEMS: TypeAdapter[list[ConversationItem | UnsupportedItem]] = TypeAdapter(list[InputItem])


def stored_items(items: tuple[dict[str, object], ...]) -> list[ConversationItem]:
    """Items kept as JSON (api/response_store.py), as the conversation items they were."""
    return [i for i in _ITEMS.validate_python(list(items)) if not isinstance(i, UnsupportedItem)]


def item_json(item: ConversationItem) -> dict[str, object]:
    """An item as it is kept and listed: a message's text content as one text part."""
    shown = item.model_dump(by_alias=True, exclude_none=True)
    if isinstance(item, MessageItem) and isinstance(item.content, str):
        kind = "output_text" if item.role == "assistant" else "input_text"
        shown["content"] = [{"type": kind, "text": item.content}]
    return shown


class FunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    strict: bool | None = None  # accepted: calls are always constrained to the schema


class UnsupportedTool(_Strict):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str


def _tool_tag(value: object) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", "")
    return "function" if kind == "function" else "unsupported"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[UnsupportedTool, Tag("unsupported")],
    Discriminator(_tool_tag),
]


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class TextFormatText(_Strict):
    type: Literal["text"]


class TextFormatJsonObject(_Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Strict):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, JsonValue] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # accepted; the schema is always enforced exactly


TextFormat = Annotated[
    TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
]


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, ignored


class ResponsesRequest(_Strict):
    """Body of POST /v1/responses (and of a WebSocket `response.create`, less `type`)."""

    model: str = Field(min_length=1, max_length=256)
    input: str | InputItems = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = Field(None, pattern=ID_PATTERN)
    store: bool | None = None
    stream: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: dict[str, str] | None = Field(None, max_length=MAX_METADATA)
    truncation: Literal["disabled", "auto"] | None = None
    priority: Literal["high", "normal", "low"] | None = None  # InferFlux extension
    seed: int | None = None  # InferFlux extension
    # accepted, ignored: they cannot change what the model generates
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, JsonValue] | None = None
    # refused unless absent, empty or off (`check_supported`)
    reasoning: JsonValue = None
    include: list[str] | None = None
    background: bool | None = None
    conversation: JsonValue = None
    prompt: JsonValue = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None

    def check_supported(self) -> None:
        """A 400 naming what a text-only, local server cannot honour."""
        refused = {
            "background": bool(self.background),
            "conversation": self.conversation is not None,
            "prompt": self.prompt is not None,
            "include": bool(self.include),
            "top_logprobs": bool(self.top_logprobs),
            "max_tool_calls": self.max_tool_calls is not None,
            "truncation": self.truncation == "auto",
        }
        if not self.input and self.previous_response_id is None:
            raise InvalidRequest("input is required", param="input")
        for name, is_set in refused.items():
            if is_set:
                raise InvalidRequest(f"'{name}' is not supported by this server", param=name)
        effort = self.reasoning.get("effort") if isinstance(self.reasoning, dict) else None
        if effort not in (None, "none") or not isinstance(self.reasoning, dict | None):
            raise InvalidRequest("reasoning is not supported by this model", param="reasoning")
        for index, tool in enumerate(self.tools or []):
            if isinstance(tool, UnsupportedTool):
                raise InvalidRequest(
                    f"tools of type '{tool.type}' are not supported: only 'function'",
                    param=f"tools[{index}].type",
                )
        for index, item in enumerate(self.input_items()):
            _check_item(item, f"input[{index}]")

    def input_items(self) -> list[ConversationItem | UnsupportedItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def checked_input(self) -> list[ConversationItem]:
        """The input items (`check_supported` refused the others)."""
        return [item for item in self.input_items() if not isinstance(item, UnsupportedItem)]

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's view of the request (OpenAI's defaults: temperature and top_p 1)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
        )

    def engine_priority(self) -> Priority:
        return Priority(self.priority or "normal")

    def stores(self) -> bool:
        return self.store is not False

    def output_spec(self) -> JsonOutput | None:
        fmt = self.text.format if self.text is not None else None
        if isinstance(fmt, TextFormatJsonSchema):
            return JsonOutput(fmt.schema_, "text.format.schema")
        if isinstance(fmt, TextFormatJsonObject):
            return JsonOutput(None, "text.format")
        return None

    def tool_plan(self, check_bounds: BoundsCheck | None) -> ToolPlan | None:
        """The tools the model may call (None: none); InvalidRequest for bad ones."""
        functions = [t for t in self.tools or [] if isinstance(t, FunctionTool)]
        definitions = [
            ToolDefinition(
                type="function",
                function=FunctionDefinition(
                    name=tool.name, description=tool.description, parameters=tool.parameters
                ),
            )
            for tool in functions
        ]
        choice = self.tool_choice
        named: ToolChoice | None = (
            NamedToolChoice.model_validate({"type": "function", "function": {"name": choice.name}})
            if isinstance(choice, FunctionChoice)
            else choice
        )
        return resolve_tools(
            definitions or None, named, self.parallel_tool_calls, check_bounds=check_bounds
        )


def _check_item(item: ConversationItem | UnsupportedItem, param: str) -> None:
    if isinstance(item, UnsupportedItem):
        raise InvalidRequest(
            f"input items of type '{item.type}' are not supported: send messages, "
            "function_call and function_call_output items",
            param=f"{param}.type",
        )
    if isinstance(item, MessageItem) and not isinstance(item.content, str):
        for position, part in enumerate(item.content):
            if isinstance(part, UnsupportedContent):
                raise InvalidRequest(
                    f"'{part.type}' content is not supported: this model reads text",
                    param=f"{param}.content[{position}]",
                )


def template_messages(
    instructions: str | None,
    items: list[ConversationItem],
    images: ImageSet | None = None,
    first_input: int = 0,
) -> list[dict[str, object]]:
    """The conversation as the chat template sees it: `instructions` as the system prompt,
    `developer` messages as `system`, function calls as the assistant turn's `tool_calls`
    and their outputs as `tool` messages, images as `MessageItem.text` says. `items[k]`
    is this request's `input[k - first_input]` (earlier ones are stored history)."""
    out: list[dict[str, object]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    names: dict[str, str] = {}
    for index, item in enumerate(items):
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            where = index - first_input
            param = f"input[{where}]" if where >= 0 else "previous_response_id"
            out.append({"role": role, "content": item.text(param, images)})
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            call = {"id": item.call_id, "type": "function", "function": _function(item)}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                calls = last.setdefault("tool_calls", [])
                assert isinstance(calls, list)
                calls.append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            tool: dict[str, object] = {"role": "tool", "content": item.text()}
            tool["tool_call_id"] = item.call_id
            if item.call_id in names:
                tool["name"] = names[item.call_id]
            out.append(tool)
    return out


def _function(item: FunctionCallItem) -> dict[str, object]:
    """A call in Hugging Face's template shape (arguments as an object when they parse)."""
    try:
        arguments: object = json.loads(item.arguments)
    except ValueError:
        arguments = item.arguments
    return {"name": item.name, "arguments": arguments}


class InputTokensRequest(_Strict):
    """Body of POST /v1/responses/input_tokens: the prompt parts of a `ResponsesRequest`
    (`model` optional: the default model)."""

    model: str | None = Field(None, min_length=1, max_length=256)
    input: str | InputItems = ""
    instructions: str | None = None
    previous_response_id: str | None = Field(None, pattern=ID_PATTERN)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled", "auto"] | None = None
    reasoning: JsonValue = None
    conversation: JsonValue = None

    def as_request(self, model: str) -> ResponsesRequest:
        fields = self.model_dump(by_alias=True, exclude_none=True)
        return ResponsesRequest.model_validate({**fields, "model": model})
