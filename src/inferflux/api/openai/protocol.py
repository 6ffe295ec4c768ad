"""Pydantic models of the OpenAI request bodies InferFlux accepts (the HTTP edge only).

Owns: the shape and static bounds of `/v1/chat/completions` and `/v1/completions` bodies,
which optional OpenAI hints are accepted and ignored, and which features are refused as
"not supported yet" (`reject_unsupported`). Does not own: checks that need the model
(context length, vocabulary size: `generation.py`) or response shapes (built as plain
dicts and encoded with msgspec on the hot path).

Validation is strict (JSON types are never coerced: `"1"` is not a number) and unknown
fields are refused, so a typo never silently becomes a default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, ClassVar, Literal, Self, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from inferflux.engine.messages import SamplingParams
from inferflux.errors import InvalidRequest

MAX_STOP_SEQUENCES = 16
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # accepted, ignored (we add no obfuscation)


class ContentPart(BaseModel):
    """One part of a message's content array; only `text` parts are supported."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _only_text(self) -> Self:
        if self.type != "text":
            raise PydanticCustomError(
                "unsupported_content_part",
                "content part type '{part_type}' is not supported yet; send 'text' parts",
                {"part_type": self.type},
            )
        if self.text is None:
            raise PydanticCustomError("missing_text", "a 'text' content part needs a 'text' string")
        return self


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[JsonValue] | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> Self:
        if self.content is None and self.role != "assistant":
            raise PydanticCustomError(
                "missing_content", "a {role} message needs content", {"role": self.role}
            )
        return self

    def text(self) -> str:
        """The content as one string (text parts joined by newlines)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)

    def for_template(self) -> dict[str, object]:
        """The message as a chat template sees it (`developer` renders as `system`)."""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, object] = {"role": role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _is_none_or(*allowed: object) -> Callable[[object], bool]:
    return lambda value: value is None or value in allowed


class GenerationRequest(_Strict):
    """Fields shared by chat and text completions."""

    # Fields that must keep their default until the feature lands (never silently ignored).
    UNSUPPORTED: ClassVar[dict[str, Callable[[object], bool]]] = {
        "response_format": lambda v: v is None or v == {"type": "text"},
        "logprobs": lambda v: v is None or v is False,
        "grammar": _is_none_or(),
    }

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=_SEED_MIN, le=_SEED_MAX)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_penalty: float | None = Field(None, gt=0.0)
    logit_bias: dict[str, Bias] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    # OpenAI hints: accepted and ignored.
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    # Not supported yet: refused unless default (see UNSUPPORTED).
    response_format: JsonValue = None
    logprobs: bool | int | None = None
    grammar: JsonValue = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        sequences = [stop] if isinstance(stop, str) else stop or []
        if len(sequences) > MAX_STOP_SEQUENCES:
            raise PydanticCustomError(
                "too_many_stop", "at most {n} stop sequences are allowed", {"n": MAX_STOP_SEQUENCES}
            )
        if any(not s for s in sequences):
            raise PydanticCustomError("empty_stop", "stop sequences must not be empty strings")
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _check_bias_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
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

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(key): value for key, value in (self.logit_bias or {}).items()}

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's view of this request, `max_tokens` resolved against the context."""
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
        )


class ChatCompletionRequest(GenerationRequest):
    """Body of POST /v1/chat/completions."""

    UNSUPPORTED: ClassVar[dict[str, Callable[[object], bool]]] = {
        **GenerationRequest.UNSUPPORTED,
        "tools": lambda v: not v,
        "tool_choice": _is_none_or("none", "auto"),
        "functions": lambda v: not v,
        "function_call": _is_none_or("none", "auto"),
        "top_logprobs": _is_none_or(0),
        "modalities": lambda v: v is None or v == ["text"],
        "audio": _is_none_or(),
        "prediction": _is_none_or(),
        "web_search_options": _is_none_or(),
        "reasoning_effort": _is_none_or(),
        "verbosity": _is_none_or(),
    }

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # OpenAI hints: accepted and ignored.
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Not supported yet.
    tools: JsonValue = None
    tool_choice: JsonValue = None
    functions: JsonValue = None
    function_call: JsonValue = None
    top_logprobs: JsonValue = None
    modalities: JsonValue = None
    audio: JsonValue = None
    prediction: JsonValue = None
    web_search_options: JsonValue = None
    reasoning_effort: JsonValue = None
    verbosity: JsonValue = None

    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def template_messages(self) -> list[dict[str, object]]:
        """Messages as the chat template sees them. Raises InvalidRequest for tool calls."""
        for index, message in enumerate(self.messages):
            if message.tool_calls:
                raise InvalidRequest(
                    "tool calls are not supported yet", param=f"messages[{index}].tool_calls"
                )
        return [message.for_template() for message in self.messages]


PromptInput = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(GenerationRequest):
    """Body of POST /v1/completions."""

    UNSUPPORTED: ClassVar[dict[str, Callable[[object], bool]]] = {
        **GenerationRequest.UNSUPPORTED,
        "echo": _is_none_or(False),
        "best_of": _is_none_or(1),
        "suffix": _is_none_or(""),
    }

    prompt: PromptInput
    echo: JsonValue = None
    best_of: JsonValue = None
    suffix: JsonValue = None

    def prompt_input(self) -> str | list[int]:
        """The one prompt: a string or token ids. Raises InvalidRequest for batches or empty."""
        prompt = self.prompt
        single: str | list[int]
        if isinstance(prompt, str):
            single = prompt
        elif prompt and not isinstance(prompt[0], int):
            if len(prompt) > 1:
                raise InvalidRequest(
                    "more than one prompt per request is not supported yet", param="prompt"
                )
            single = prompt[0]
        else:
            single = cast("list[int]", prompt)  # empty, or token ids
        if not single:
            raise InvalidRequest("prompt must not be empty", param="prompt")
        return single


def reject_unsupported(request: GenerationRequest) -> None:
    """Raise InvalidRequest naming the first feature that is set but not supported yet."""
    if request.n is not None and request.n > 1:
        raise InvalidRequest("n > 1 is not supported yet; send n=1 or leave it out", param="n")
    for name, is_default in request.UNSUPPORTED.items():
        if not is_default(getattr(request, name)):
            raise InvalidRequest(f"{name} is not supported yet", param=name)
