"""Pydantic models of the OpenAI request bodies InferFlux accepts (the HTTP edge only).

Owns: the shape and static bounds of `/v1/chat/completions`, `/v1/completions`,
`/tokenize` and `/detokenize` bodies, and their mapping to the generation service's terms
(`SamplingParams`, the output constraint). Does not own: which OpenAI parameters are
accepted-and-ignored or refused as "not supported yet" (`compat.py`), checks that need the
model (context length, vocabulary size, compiling grammars: the service's planner), or
response shapes (plain dicts encoded with msgspec on the hot path).

Validation is strict (JSON types are never coerced: `"1"` is not a number) and unknown
fields are refused, so a typo never silently becomes a default.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from inferflux.api.generation.limits import check_stop_sequences
from inferflux.api.generation.sampler_options import SamplerOptions
from inferflux.api.generation.spec import (
    GenerationSpec,
    GrammarOutput,
    JsonOutput,
    OutputSpec,
    Prompt,
)
from inferflux.api.images import ImageRef, ImageSet, take_image, url_ref
from inferflux.api.tools.protocol import AssistantToolCall, ToolChoice, ToolDefinition
from inferflux.engine.messages import Priority, SamplingParams
from inferflux.errors import InvalidRequest

MAX_N = 16  # choices per prompt
MAX_CHOICES = 64  # choices per request (prompts × n)
MAX_LOGIT_BIAS = 1024
MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class JsonSchemaSpec(_Strict):
    """`response_format.json_schema`: a named JSON Schema the output must satisfy."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, JsonValue] | None = Field(None, alias="schema")  # None: any object
    strict: bool | None = None  # accepted; the schema is always enforced exactly


class TextFormat(_Strict):
    type: Literal["text"]


class JsonObjectFormat(_Strict):
    """`{"type": "json_object"}`: any JSON object (llama-server's optional `schema` too)."""

    type: Literal["json_object"]
    schema_: dict[str, JsonValue] | None = Field(None, alias="schema")


class JsonSchemaFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


def _format_tag(value: object) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"type={kind}" if kind in ("text", "json_object", "json_schema") else None


# NOTE: tags are not field-like, so error params read `response_format.json_schema.name`.
ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("type=text")]
    | Annotated[JsonObjectFormat, Tag("type=json_object")]
    | Annotated[JsonSchemaFormat, Tag("type=json_schema")],
    Discriminator(
        _format_tag,
        custom_error_type="invalid_response_format",
        custom_error_message='response_format needs "type": "text", "json_object" or "json_schema"',
    ),
]


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # accepted, ignored (we add no obfuscation)


class ImageUrl(_Strict):
    """An `image_url` part's image: a data URI or an http(s) URL (api/images)."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the mmproj decides


class ContentPart(BaseModel):
    """One part of a message's content array: `text` or `image_url`."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    type: str
    text: str | None = None
    image_url: ImageUrl | str | None = None  # a bare string: the url (vLLM takes it too)

    @model_validator(mode="after")
    def _known_part(self) -> Self:
        if self.type not in ("text", "image_url"):
            raise PydanticCustomError(
                "unsupported_content_part",
                "content part type '{part_type}' is not supported; 'text' and 'image_url' "
                "parts are",
                {"part_type": str(self.type)[:64]},
            )
        if self.type == "text" and (self.text is None or self.image_url is not None):
            raise PydanticCustomError("missing_text", "a 'text' content part needs a 'text' string")
        if self.type == "image_url" and (self.image_url is None or self.text is not None):
            raise PydanticCustomError(
                "missing_image_url",
                "an 'image_url' content part needs an 'image_url' object with a 'url'",
            )
        if self.model_extra:
            raise PydanticCustomError(
                "unknown_part_field",
                "unrecognized field '{name}' in a '{part_type}' content part",
                {"name": next(iter(self.model_extra))[:64], "part_type": self.type},
            )
        return self

    def image_ref(self, param: str) -> ImageRef:
        """This `image_url` part's image. Raises InvalidRequest for a malformed URL."""
        image = self.image_url
        url = image.url if isinstance(image, ImageUrl) else str(image)
        return url_ref(url, f"{param}.image_url")


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[AssistantToolCall] | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> Self:
        if self.content is None and self.role != "assistant":
            raise PydanticCustomError(
                "missing_content", "a {role} message needs content", {"role": self.role}
            )
        return self

    def text(self, param: str = "messages", images: ImageSet | None = None) -> str:
        """The content as one string (parts joined by newlines); an `image_url` part
        becomes `images.marker`, its image added to `images`. Raises InvalidRequest for an
        image without `images` (where images are not taken) or with a malformed URL."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        texts = []
        for index, part in enumerate(self.content):
            if part.type != "image_url":
                texts.append(part.text or "")
                continue
            texts.append(take_image(images, self.role, f"{param}.content[{index}]", part.image_ref))
        return "\n".join(texts)

    def for_template(
        self, param: str = "messages", images: ImageSet | None = None
    ) -> dict[str, object]:
        """The message as a chat template sees it (`developer` renders as `system`;
        `tool_calls` in Hugging Face's shape, arguments as objects; images as
        `ChatMessage.text` says). Raises InvalidRequest for tool calls on a non-assistant
        message, arguments that are not JSON objects, or a refused image part."""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, object] = {"role": role, "content": self.text(param, images)}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            if self.role != "assistant":
                raise InvalidRequest(
                    "only assistant messages may carry tool_calls", param=f"{param}.tool_calls"
                )
            message["tool_calls"] = [
                _template_call(call, f"{param}.tool_calls[{i}]")
                for i, call in enumerate(self.tool_calls)
            ]
        return message


def _template_call(call: AssistantToolCall, param: str) -> dict[str, object]:
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise InvalidRequest(
            "tool call arguments must be a JSON object encoded as a string",
            param=f"{param}.function.arguments",
        )
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": "function", "function": function}


def template_messages(
    messages: list[ChatMessage], images: ImageSet | None = None
) -> list[dict[str, object]]:
    """Messages as the chat template sees them (see `ChatMessage.for_template`); image
    parts go into `images` (None: they are refused)."""
    return [message.for_template(f"messages[{i}]", images) for i, message in enumerate(messages)]


class GenerationRequest(_Strict, SamplerOptions):
    """Fields shared by chat and text completions (llama.cpp's other samplers, from
    `SamplerOptions`, are extensions)."""

    model: str | None = None
    adapter: str | None = Field(None, min_length=1, max_length=128)  # InferFlux: LoRA adapter
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=2**31 - 1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int | None = Field(None, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=_SEED_MIN, le=_SEED_MAX)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_penalty: float | None = Field(None, gt=0.0)
    logit_bias: dict[str, Bias] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    grammar: str | None = Field(None, min_length=1)
    grammar_syntax: Literal["gbnf", "lark", "regex"] | None = None  # of `grammar`; gbnf
    priority: Literal["high", "normal", "low"] | None = None
    # OpenAI hints: accepted and ignored (compat.ACCEPTED_IGNORED says why).
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    response_format: ResponseFormat | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        return check_stop_sequences(stop)

    @field_validator("logit_bias")
    @classmethod
    def _check_bias_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias is not None and len(bias) > MAX_LOGIT_BIAS:
            raise PydanticCustomError(
                "too_many_bias", "logit_bias may name at most {n} tokens", {"n": MAX_LOGIT_BIAS}
            )
        for key in bias or {}:
            if not key.isascii() or not key.isdigit():
                raise PydanticCustomError(
                    "bad_token_id", "logit_bias keys must be token ids, not '{key}'", {"key": key}
                )
        return bias

    @field_validator("stream_options")
    @classmethod
    def _check_stream_options(
        cls, options: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise PydanticCustomError(
                "stream_options_without_stream", "stream_options is only allowed with stream=true"
            )
        return options

    def num_choices(self) -> int:
        return self.n or 1

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(key): value for key, value in (self.logit_bias or {}).items()}

    def engine_priority(self) -> Priority:
        return Priority(self.priority or "normal")

    def num_logprobs(self) -> int | None:
        """How many top alternatives each sampled token reports (None: no logprobs)."""
        return None

    def num_prompt_logprobs(self) -> int | None:
        """How many top alternatives each prompt token reports (None: none)."""
        return None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's view of the request, `max_tokens` resolved against the context
        (the generation service derives each choice's seed and sets the constraint)."""
        stop = self.stop if isinstance(self.stop, list) else [self.stop] if self.stop else []
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            seed=self.seed,
            repeat_penalty=1.0 if self.repeat_penalty is None else self.repeat_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=self.logit_bias_ids(),
            stop=stop,
            ignore_eos=bool(self.ignore_eos),
            logprobs=self.num_logprobs(),
            prompt_logprobs=self.num_prompt_logprobs(),
            **self.sampler_fields(),  # type: ignore[arg-type]
        )

    def generation_spec(
        self, id_prefix: str, prompts: Sequence[Prompt], prompt_param: str
    ) -> GenerationSpec:
        """The request in the generation service's terms, over its tokenizable `prompts`
        (n choices each). Raises InvalidRequest for a bad output constraint."""
        return GenerationSpec(
            id_prefix=id_prefix,
            prompts=prompts,
            sampling=self.sampling_params,
            prompt_param=prompt_param,
            n=self.num_choices(),
            max_tokens=self.requested_max_tokens(),
            priority=self.engine_priority(),
            output=self.output_spec(),
            stream=bool(self.stream),
        )

    def output_spec(self) -> OutputSpec | None:
        """The constraint `response_format` (json_object / json_schema) or `grammar` asks
        for (None: free output). Raises InvalidRequest (400) for both at once, or a
        grammar_syntax without a grammar; the service compiles it."""
        fmt = self.response_format
        json_format = isinstance(fmt, JsonObjectFormat | JsonSchemaFormat)
        if self.grammar is not None:
            if json_format:
                raise InvalidRequest(
                    "send either `grammar` or a JSON `response_format`, not both", param="grammar"
                )
            return GrammarOutput(self.grammar, self.grammar_syntax or "gbnf", "grammar")
        if self.grammar_syntax is not None:
            raise InvalidRequest("grammar_syntax needs a grammar", param="grammar_syntax")
        if isinstance(fmt, JsonSchemaFormat):
            return JsonOutput(fmt.json_schema.schema_, "response_format.json_schema.schema")
        if isinstance(fmt, JsonObjectFormat):
            return JsonOutput(fmt.schema_, "response_format.schema")
        return None


class ChatCompletionRequest(GenerationRequest):
    """Body of POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI hints: accepted and ignored (compat.ACCEPTED_IGNORED says why).
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Checked by compat.reject_unsupported: refused unless absent or harmless.
    modalities: JsonValue = None
    functions: JsonValue = None
    function_call: JsonValue = None
    audio: JsonValue = None
    prediction: JsonValue = None
    web_search_options: JsonValue = None
    reasoning_effort: JsonValue = None
    verbosity: JsonValue = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> Self:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest(
                "top_logprobs needs logprobs=true; set logprobs or leave top_logprobs out",
                param="top_logprobs",
            )
        return self

    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self, images: ImageSet | None = None) -> list[dict[str, object]]:
        """Messages as the chat template sees them (see `ChatMessage.for_template`)."""
        return template_messages(self.messages, images)


PromptInput = str | list[str] | list[int] | list[list[int]]


def prompt_list(prompt: PromptInput) -> list[str | list[int]]:
    """The prompts of an OpenAI `prompt` field: each a string or token ids.

    Raises InvalidRequest for an empty list or an empty prompt.
    """
    prompts: list[str | list[int]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompts = [[t for t in prompt if isinstance(t, int)]]
    else:
        prompts = [p for p in prompt if not isinstance(p, int)]
    if not prompts:
        raise InvalidRequest("prompt must not be empty", param="prompt")
    for index, single in enumerate(prompts):
        if not single:
            param = "prompt" if len(prompts) == 1 else f"prompt[{index}]"
            raise InvalidRequest("prompt must not be empty", param=param)
    return prompts


class CompletionRequest(GenerationRequest):
    """Body of POST /v1/completions."""

    prompt: PromptInput
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    # Checked by compat.reject_unsupported.
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = None

    @model_validator(mode="after")
    def _check_choice_count(self) -> Self:
        prompt = self.prompt
        batch = isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
        num_prompts = len(prompt) if batch else 1
        if num_prompts * self.num_choices() > MAX_CHOICES:
            raise InvalidRequest(
                f"{num_prompts} prompts × n={self.num_choices()} is more than the "
                f"{MAX_CHOICES} choices one request may ask for; split the request",
                param="prompt",
            )
        return self

    def prompt_inputs(self) -> list[str | list[int]]:
        """Every prompt, in order (a string or token ids each)."""
        return prompt_list(self.prompt)

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def num_prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None


class TokenizeRequest(_Strict):
    """Body of POST /tokenize (vLLM's shape): a `prompt`, or chat `messages`."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool | None = None  # vLLM's name
    add_special: bool | None = None  # llama.cpp's name
    add_generation_prompt: bool = True  # messages only
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("send exactly one of 'prompt' and 'messages'", param="prompt")
        a, b = self.add_special_tokens, self.add_special
        if a is not None and b is not None and a != b:
            raise InvalidRequest(
                "add_special and add_special_tokens disagree; send one", param="add_special"
            )
        return self

    def add_special_override(self) -> bool | None:
        """The client's choice of adding BOS/EOS, or None for the default."""
        return self.add_special_tokens if self.add_special_tokens is not None else self.add_special


class DetokenizeRequest(_Strict):
    """Body of POST /detokenize."""

    model: str | None = None
    tokens: list[int]
