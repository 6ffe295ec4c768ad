"""Pydantic models of the Ollama request bodies (`/api/*`) and their mapping to the engine.

Owns: the shapes of the `/api/generate`, `/api/chat`, `/api/show`, `/api/embed` and
`/api/embeddings` bodies, Ollama's `options` and their mapping to `SamplingParams` (with
Ollama's defaults), `keep_alive` durations, and the parameters refused as not supported.
Does not own: response shapes (plain dicts in the route modules) or model-dependent checks.

Like Ollama (Go's encoding/json), unknown top-level fields and unknown `options` are
ignored, but JSON types are never coerced: `"temperature": "0.5"` is a 400. Options that
would change sampling in a way the engine cannot honour (mirostat, typical_p < 1) are
refused rather than silently dropped; load-time options (num_ctx, num_gpu, num_thread, ...)
are accepted and ignored: the server's configuration decides them.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic_core import PydanticCustomError

from inferflux.api.generation.limits import check_stop_sequences
from inferflux.api.generation.sampler_options import SamplerOptions
from inferflux.api.generation.spec import JsonOutput, OutputSpec
from inferflux.api.images import ImageSet, base64_ref
from inferflux.api.tools.parser import new_call_id
from inferflux.api.tools.protocol import BoundsCheck, ToolDefinition, ToolPlan, resolve_tools
from inferflux.config.manifest import ModelParameters
from inferflux.engine.messages import Priority, SamplingParams
from inferflux.errors import InvalidRequest

logger = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 20
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1
_INT32_MAX = 2**31 - 1  # llama.cpp takes top_k and the penalty window as int32

# Ollama's defaults (api.DefaultOptions) for what a request leaves unset.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.9
DEFAULT_TOP_K = 40
DEFAULT_MIN_P = 0.0
DEFAULT_REPEAT_PENALTY = 1.1
DEFAULT_REPEAT_LAST_N = 64

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_SECONDS = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)")
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}

PriorityName = Literal["high", "normal", "low"]
KeepAlive = float | str


def parse_keep_alive(value: KeepAlive | None) -> float | None:
    """Seconds of an Ollama `keep_alive` (a number of seconds, or a Go duration such as
    "5m", "1h30m", "0"; a bare number in a string is read as seconds, as Ollama's
    OLLAMA_KEEP_ALIVE is); negative means forever (`math.inf`); None stays None.

    Raises ValueError for a string that is not a Go duration.
    """
    if value is None:
        return None
    if isinstance(value, int | float):
        return math.inf if value < 0 else float(value)
    text = value.strip()
    if _SECONDS.fullmatch(text):
        return parse_keep_alive(float(text))
    sign = -1.0 if text.startswith("-") else 1.0
    text = text.lstrip("+-")
    seconds, position = 0.0, 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if not text or position != len(text):
        raise ValueError(f"invalid duration {value!r}: use seconds or a duration like '5m'")
    return math.inf if sign < 0 and seconds > 0 else seconds


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class OllamaOptions(SamplerOptions):
    """Ollama's `options`. Unknown keys are ignored (and logged), as Ollama does.
    llama.cpp's other samplers (`mirostat`, `typical_p`, DRY, XTC, ...) come from
    `SamplerOptions`."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    # runtime options: mapped to SamplingParams
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, le=_INT32_MAX)  # <= 0: off
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    # <= 0 (-1, -2): until the context is full; past int64 is a 400, as in Ollama
    num_predict: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=_SEED_MIN, le=_SEED_MAX)  # < 0: random
    repeat_penalty: float | None = Field(default=None, ge=0.0, le=100.0)  # 0: off
    presence_penalty: float | None = Field(default=None, ge=-100.0, le=100.0)
    frequency_penalty: float | None = Field(default=None, ge=-100.0, le=100.0)
    # accepted and ignored: no effect on our sampler, or decided by the server config
    tfs_z: float | None = None
    penalize_newline: bool | None = None
    num_keep: int | None = None
    num_ctx: int | None = Field(default=None, ge=0)
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    numa: bool | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        return check_stop_sequences(stop)

    @model_validator(mode="after")
    def _log_unknown(self) -> Self:
        for name in self.model_extra or {}:
            logger.info("ignoring unknown Ollama option %r", name[:64])
        return self

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


def with_model_defaults(
    options: OllamaOptions | None, defaults: ModelParameters | None
) -> OllamaOptions | None:
    """The request's options over the model's default `parameters` (`ollama create`):
    an option the request sets wins, one it leaves unset takes the model's value."""
    if defaults is None:
        return options
    given = options.model_dump(exclude_unset=True) if options is not None else {}
    return OllamaOptions.model_validate({**defaults.options(), **given})


def requested_max_tokens(options: OllamaOptions | None) -> int | None:
    """`num_predict` when it is a positive limit, else None (generate until the context is
    full, or an end-of-generation token)."""
    if options is None or options.num_predict is None or options.num_predict <= 0:
        return None
    return options.num_predict


def sampling_params(
    options: OllamaOptions | None,
    *,
    max_tokens: int,
    n_ctx: int,
    logprobs: int | None = None,
    constraint: str | None = None,
) -> SamplingParams:
    """The engine's sampling for Ollama `options`, Ollama's defaults for what is unset.
    `logprobs`: None, or how many alternatives each sampled token reports; `constraint`:
    the compiled `format`."""
    o = options or OllamaOptions()
    repeat_last_n = DEFAULT_REPEAT_LAST_N if o.repeat_last_n is None else o.repeat_last_n
    repeat_penalty = DEFAULT_REPEAT_PENALTY if o.repeat_penalty is None else o.repeat_penalty
    others = {k: v for k, v in o.sampler_fields().items() if k != "penalty_last_n"}
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=DEFAULT_TEMPERATURE if o.temperature is None else o.temperature,
        top_p=DEFAULT_TOP_P if o.top_p is None else o.top_p,
        top_k=DEFAULT_TOP_K if o.top_k is None else max(o.top_k, 0),
        min_p=DEFAULT_MIN_P if o.min_p is None else o.min_p,
        seed=None if o.seed is None or o.seed < 0 else o.seed,
        repeat_penalty=repeat_penalty if repeat_penalty > 0 else 1.0,
        presence_penalty=o.presence_penalty or 0.0,
        frequency_penalty=o.frequency_penalty or 0.0,
        penalty_last_n=n_ctx if repeat_last_n < 0 else repeat_last_n,
        stop=o.stop_list(),
        logprobs=logprobs,
        constraint=constraint,
        **others,  # type: ignore[arg-type]
    )


class GenerationBody(_Body):
    """Fields `/api/generate` and `/api/chat` share."""

    model: str | None = None
    adapter: str | None = Field(None, min_length=1, max_length=128)  # InferFlux: LoRA adapter
    stream: bool | None = None  # Ollama streams unless told not to
    format: JsonValue = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None
    think: bool | str | None = None  # accepted, ignored: no thinking models served yet
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    priority: PriorityName | None = None  # InferFlux extension

    @field_validator("keep_alive")
    @classmethod
    def _check_keep_alive(cls, value: KeepAlive | None) -> KeepAlive | None:
        try:
            parse_keep_alive(value)
        except ValueError as exc:
            raise PydanticCustomError("invalid_duration", str(exc)) from None
        return value

    def streaming(self) -> bool:
        return self.stream is not False

    def keep_alive_s(self) -> float | None:
        return parse_keep_alive(self.keep_alive)

    def engine_priority(self) -> Priority:
        return Priority(self.priority or "normal")

    def num_logprobs(self) -> int | None:
        """None: no logprobs; k: each token's logprob plus its k most likely alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None


class OllamaGenerateRequest(GenerationBody):
    """Body of POST /api/generate."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None


class OllamaToolCallFunction(_Body):
    name: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    index: int | None = None  # accepted, ignored (Ollama numbers the calls of a turn)


class OllamaToolCall(_Body):
    """One call of an assistant message in history (Ollama's shape: arguments as an
    object)."""

    id: str | None = None
    function: OllamaToolCallFunction

    def for_template(self) -> dict[str, object]:
        function = {"name": self.function.name, "arguments": dict(self.function.arguments)}
        return {"id": self.id or new_call_id(), "type": "function", "function": function}


class OllamaMessage(_Body):
    """One message of `/api/chat`."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None  # accepted, ignored
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None

    def for_template(
        self, param: str = "messages", images: ImageSet | None = None
    ) -> dict[str, object]:
        """The message as the chat template sees it; its `images` (base64) go into
        `images` and stand before its text as markers. Raises InvalidRequest for images
        where none are taken (`images` None), on a non-user message, or malformed."""
        content = self.content or ""
        if self.images:
            content = with_images(content, self.images, f"{param}.images", images)
            if self.role != "user":
                raise InvalidRequest("only user messages may carry images", param=f"{param}.images")
        message: dict[str, object] = {"role": self.role, "content": content}
        if self.tool_name is not None:
            message["name"] = self.tool_name
        if self.tool_calls:
            message["tool_calls"] = [call.for_template() for call in self.tool_calls]
        return message


class OllamaChatRequest(GenerationBody):
    """Body of POST /api/chat. With `tools`, the model may call them (Ollama has no
    tool_choice: always "auto", several calls allowed)."""

    messages: list[OllamaMessage] | None = None
    tools: list[ToolDefinition] | None = None

    def tool_plan(self, check_bounds: BoundsCheck | None = None) -> ToolPlan | None:
        """The tools the model may call (None: none); InvalidRequest for bad ones
        (`check_bounds`: the size and depth limits of parameter schemas)."""
        return resolve_tools(self.tools, None, None, check_bounds=check_bounds)

    def template_messages(self, images: ImageSet | None = None) -> list[dict[str, object]]:
        """Messages as the chat template sees them, their images added to `images` (None:
        images are refused); InvalidRequest for a bad image and for tool calls on a
        non-assistant message."""
        messages = self.messages or []
        for index, message in enumerate(messages):
            if message.tool_calls and message.role != "assistant":
                raise InvalidRequest(
                    "only assistant messages may carry tool_calls",
                    param=f"messages[{index}].tool_calls",
                )
        return [
            message.for_template(f"messages[{index}]", images)
            for index, message in enumerate(messages)
        ]


def with_images(text: str, encoded: list[str], param: str, images: ImageSet | None) -> str:
    """`text` with a marker per image of `encoded` (Ollama's base64 list) before it, each
    image added to `images`. Raises InvalidRequest for malformed base64, or for any image
    when `images` is None (not taken here)."""
    if images is None:
        raise InvalidRequest("images are not taken here", param=param)
    markers = [images.add(base64_ref(item, f"{param}[{i}]")) for i, item in enumerate(encoded)]
    return "\n".join([*markers, text]) if text else "\n".join(markers)


class OllamaShowRequest(_Body):
    """Body of POST /api/show (`name` is Ollama's deprecated spelling of `model`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None


class OllamaEmbedRequest(_Body):
    """Body of POST /api/embed."""

    model: str | None = None
    input: str | list[str] = Field(default_factory=list)
    truncate: bool | None = None
    dimensions: int | None = Field(default=None, ge=1)
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class OllamaEmbeddingsRequest(_Body):
    """Body of the legacy POST /api/embeddings."""

    model: str | None = None
    prompt: str | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive | None = None


def format_output(format_: JsonValue) -> OutputSpec | None:
    """The constraint Ollama's `format` asks for: "json" (any JSON object) or a JSON
    schema; None when absent. Raises InvalidRequest (400) for anything else; the service
    compiles it (a schema that is invalid or cannot be enforced is a 400 there)."""
    if format_ is None or format_ == "":
        return None
    if format_ == "json":
        return JsonOutput(None, "format")
    if isinstance(format_, dict):
        return JsonOutput(format_, "format")
    raise InvalidRequest('invalid format: expected "json" or a JSON schema object', param="format")
