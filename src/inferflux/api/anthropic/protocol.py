"""Pydantic models of Anthropic's Messages API bodies (`POST /v1/messages`,
`/v1/messages/count_tokens`) and their mapping to the generation service's terms.

Owns: the request shapes (messages of `user` / `assistant` turns whose content is a
string or blocks: `text`, `tool_use` in assistant turns, `tool_result` in user turns),
`system` (a string or text blocks), `tools` (`name`, `description`, `input_schema`) and
`tool_choice` (`auto`, `any`, `tool`, `none`, `disable_parallel_tool_use`), sampling
(`max_tokens` required, `temperature` 0–1, `top_p`, `top_k`, `stop_sequences`),
`output_config.format` (a JSON schema, through the constraint engine), and turning a
conversation into the chat template's messages (`template_messages`).

A conversation that ends with an assistant turn is continued from there (prefill): the
answer is the rest of that turn. Strict like the other dialects: unknown fields and wrong
JSON types are a 400. Accepted and ignored: `metadata`, `service_tier`, `cache_control`
(the prefix cache is automatic), `inference_geo`, `speed`, `anthropic-version` (a
header). `temperature`, `top_p` and `top_k` are honoured (the current SDK no longer sends
them; older clients do). Refused with a
400 naming the field: documents, `thinking` when enabled,
server tools (`web_search`, ...), `container`, `mcp_servers`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from inferflux.api.generation.limits import check_stop_sequences
from inferflux.api.generation.spec import JsonOutput
from inferflux.api.images import ImageRef, ImageSet, base64_ref, url_ref
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

MAX_MESSAGES = 4096
MAX_TOOLS = 128
MAX_TOP_K = 2**31 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: JsonValue = None  # accepted, ignored (the prefix cache is automatic)
    citations: JsonValue = None  # accepted, ignored


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=128)
    input: dict[str, JsonValue] = Field(default_factory=dict)
    cache_control: JsonValue = None


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=256)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None
    cache_control: JsonValue = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(block.text for block in self.content)


class ImageSource(_Strict):
    """An image block's source: `base64` (with `media_type`, which is not trusted: the
    format is sniffed from the bytes) or `url`."""

    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    def image_ref(self, param: str) -> ImageRef:
        """The image. Raises InvalidRequest for a source without its data or url, or a
        malformed one."""
        if self.type == "base64":
            if self.data is None:
                raise InvalidRequest("a base64 image source needs 'data'", param=param)
            return base64_ref(self.data, param)
        if self.url is None:
            raise InvalidRequest("a url image source needs 'url'", param=param)
        return url_ref(self.url, param)


class ImageBlock(_Strict):
    type: Literal["image"]
    source: ImageSource
    cache_control: JsonValue = None


class UnsupportedBlock(_Strict):
    """Blocks this server cannot take (refused with a 400 naming them)."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["document", "thinking", "redacted_thinking", "search_result"]


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | UnsupportedBlock,
    Field(discriminator="type"),
]


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolParam(_Strict):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, JsonValue]
    type: Literal["custom"] | None = None
    cache_control: JsonValue = None


class ToolChoiceParam(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, JsonValue] = Field(alias="schema")


class OutputConfig(_Strict):
    format: OutputFormat | None = None


class MessagesRequest(_Strict):
    """Body of POST /v1/messages."""

    model: str = Field(min_length=1, max_length=256)
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(ge=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K)
    stream: bool | None = None
    tools: list[ToolParam] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceParam | None = None
    output_config: OutputConfig | None = None
    priority: Literal["high", "normal", "low"] | None = None  # InferFlux extension
    # accepted, ignored: they cannot change what the model generates
    metadata: dict[str, JsonValue] | None = None
    service_tier: str | None = None
    cache_control: JsonValue = None  # the prefix cache is automatic
    inference_geo: str | None = None
    speed: str | None = None
    # refused unless absent or off (`check_supported`)
    thinking: JsonValue = None
    container: JsonValue = None
    mcp_servers: JsonValue = None

    @field_validator("stop_sequences")
    @classmethod
    def _check_stop(cls, stop: list[str] | None) -> list[str] | None:
        checked = check_stop_sequences(stop)
        return checked if isinstance(checked, list) or checked is None else [checked]

    def check_supported(self) -> None:
        """A 400 naming what a text-only, local server cannot honour."""
        thinking = self.thinking
        if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):
            raise InvalidRequest("extended thinking is not supported", param="thinking")
        for name in ("container", "mcp_servers"):
            if getattr(self, name) is not None:
                raise InvalidRequest(f"'{name}' is not supported", param=name)
        for index, message in enumerate(self.messages):
            blocks = [] if isinstance(message.content, str) else message.content
            for position, block in enumerate(blocks):
                if isinstance(block, UnsupportedBlock):
                    raise InvalidRequest(
                        f"'{block.type}' content is not supported: this model reads text",
                        param=f"messages[{index}].content[{position}]",
                    )

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's view of the request (Anthropic's default temperature is 1)."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=list(self.stop_sequences or []),
        )

    def engine_priority(self) -> Priority:
        return Priority(self.priority or "normal")

    def output_spec(self) -> JsonOutput | None:
        fmt = self.output_config.format if self.output_config else None
        return JsonOutput(fmt.schema_, "output_config.format.schema") if fmt else None

    def tool_plan(self, check_bounds: BoundsCheck | None) -> ToolPlan | None:
        """The tools the model may call (None: none); InvalidRequest for bad ones."""
        if not self.tools:
            if self.tool_choice is not None and self.tool_choice.type in ("any", "tool"):
                raise InvalidRequest("tool_choice needs tools", param="tool_choice")
            return None
        definitions = [
            ToolDefinition(
                type="function",
                function=FunctionDefinition(
                    name=tool.name, description=tool.description, parameters=tool.input_schema
                ),
            )
            for tool in self.tools
        ]
        choice = self.tool_choice
        parallel = None if choice is None else not choice.disable_parallel_tool_use
        return resolve_tools(
            definitions, _openai_choice(choice), parallel, check_bounds=check_bounds
        )

    def continues_final(self) -> bool:
        """True when the conversation ends with an assistant turn of text only: the
        answer continues it (prefill)."""
        last = self.messages[-1]
        blocks = [] if isinstance(last.content, str) else last.content
        return last.role == "assistant" and all(isinstance(b, TextBlock) for b in blocks)

    def template_messages(self, images: ImageSet | None = None) -> list[dict[str, object]]:
        """The conversation as the chat template sees it: the system prompt first, tool
        uses as assistant `tool_calls`, tool results as `tool` messages, image blocks as
        markers where they stand, their images added to `images` (None: refused)."""
        out: list[dict[str, object]] = []
        system = self.system if isinstance(self.system, str) else None
        if isinstance(self.system, list):
            system = "\n\n".join(block.text for block in self.system)
        if system:
            out.append({"role": "system", "content": system})
        names: dict[str, str] = {}
        for index, message in enumerate(self.messages):
            out += _turn(message, names, f"messages[{index}]", images)
        return out


def _openai_choice(choice: ToolChoiceParam | None) -> ToolChoice | None:
    if choice is None or choice.type == "auto":
        return None if choice is None else "auto"
    if choice.type == "any":
        return "required"
    if choice.type == "none":
        return "none"
    if not choice.name:
        raise InvalidRequest("tool_choice of type 'tool' needs a name", param="tool_choice.name")
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": choice.name}})


def _text(message: MessageParam, param: str, images: ImageSet | None) -> str:
    """The turn's text blocks joined, each image block as its marker where it stands."""
    pieces = []
    for position, block in enumerate(message.content):
        if isinstance(block, TextBlock):
            pieces.append(block.text)
        elif isinstance(block, ImageBlock):
            block_param = f"{param}.content[{position}].source"
            if images is None:
                raise InvalidRequest("images are not taken here", param=block_param)
            if message.role != "user":
                raise InvalidRequest("image blocks belong in user turns", param=block_param)
            pieces.append(images.add(block.source.image_ref(block_param)))
    return "".join(pieces)


def _turn(
    message: MessageParam, names: dict[str, str], param: str, images: ImageSet | None
) -> list[dict[str, object]]:
    """One turn as template messages (a user turn with tool results becomes `tool`
    messages, then the user's text if any)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    text = _text(message, param, images)
    uses = [b for b in message.content if isinstance(b, ToolUseBlock)]
    results = [b for b in message.content if isinstance(b, ToolResultBlock)]
    if message.role == "assistant":
        if results:
            raise InvalidRequest("tool_result blocks belong in user turns", param=param)
        turn: dict[str, object] = {"role": "assistant", "content": text}
        if uses:
            for use in uses:
                names[use.id] = use.name
            turn["tool_calls"] = [_call(use) for use in uses]
        return [turn]
    if uses:
        raise InvalidRequest("tool_use blocks belong in assistant turns", param=param)
    out: list[dict[str, object]] = []
    for result in results:
        tool: dict[str, object] = {"role": "tool", "content": result.text()}
        tool["tool_call_id"] = result.tool_use_id
        if result.tool_use_id in names:
            tool["name"] = names[result.tool_use_id]
        out.append(tool)
    if text or not results:
        out.append({"role": "user", "content": text})
    return out


def _call(use: ToolUseBlock) -> dict[str, object]:
    """A call in Hugging Face's template shape (arguments as an object)."""
    function = {"name": use.name, "arguments": dict(use.input)}
    return {"id": use.id, "type": "function", "function": function}


class CountTokensRequest(_Strict):
    """Body of POST /v1/messages/count_tokens: the prompt parts of a `MessagesRequest`."""

    model: str = Field(min_length=1, max_length=256)
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceParam | None = None
    thinking: JsonValue = None

    def as_messages_request(self) -> MessagesRequest:
        return MessagesRequest.model_validate(
            {**self.model_dump(by_alias=True, exclude_none=True), "max_tokens": 1}
        )
