"""Pydantic models of the native API (`POST /generate`, `POST /chat`): bodies and responses.

Owns: the request shapes and their static bounds, and every response shape the native
routes send (the JSON body, and each SSE event of a stream). Responses are built as these
models and serialized by them, so what a client reads always parses back into the same
model (spec requirement 11.5). Does not own: checks that need the model (context length:
the generation service's planner) or the events of a stream (`native/render.py`).

Validation is strict (JSON types are never coerced) and unknown fields are refused.
Finish reasons keep the engine's own names (`stop`, `length`, `stop_sequence`, `abort`),
unlike the OpenAI routes, which fold `stop_sequence` into `stop`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from inferflux.api.generation.limits import MAX_STOP_CHARS, MAX_STOP_SEQUENCES
from inferflux.api.generation.sampler_options import SamplerOptions
from inferflux.api.images import ImageSet, base64_ref
from inferflux.engine.messages import Priority, SamplingParams
from inferflux.errors import InvalidRequest

MAX_TOP_K = 2**31 - 1  # llama.cpp takes an int32
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1

NativeFinishReason = Literal["stop", "length", "stop_sequence", "abort", "content_filter"]
StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class GenerationKnobs(_Strict, SamplerOptions):
    """Sampling and delivery fields shared by /generate and /chat (llama.cpp's other
    samplers from `SamplerOptions`)."""

    model: str | None = Field(None, description="the served model id; omitted = that model")
    adapter: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="a LoRA adapter of the model (/v1/admin/adapters): same as model "
        "`<model>:<adapter>`",
    )
    max_tokens: int | None = Field(
        None, ge=1, description="tokens to generate at most; omitted = what the context leaves"
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 = greedy; 1 default")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="nucleus sampling; 1 = off")
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K, description="0 = off")
    stop_sequences: list[StopSequence] | None = Field(
        None,
        max_length=MAX_STOP_SEQUENCES,
        description="generation stops before the first of these strings (never streamed)",
    )
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="omitted = random")
    stream: bool = Field(False, description="true = Server-Sent Events, one per text piece")
    priority: Priority = Field(Priority.NORMAL, description="scheduling class")

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The engine's view of this request, `max_tokens` resolved against the context."""
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
            stop=list(self.stop_sequences or []),
            **self.sampler_fields(),  # type: ignore[arg-type]
        )


class NativeGenerateRequest(GenerationKnobs):
    """Body of POST /generate: complete a raw prompt (no chat template)."""

    prompt: str = Field(min_length=1, description="the text to continue")


class NativeMessage(_Strict):
    """One turn of a conversation."""

    role: Literal["system", "user", "assistant"]
    content: str
    images: list[str] | None = Field(
        None,
        description="images of a user turn, each base64 or a data URI (data:image/png;"
        "base64,...); they stand before the text. Only for a model with an mmproj",
    )


class NativeChatRequest(GenerationKnobs):
    """Body of POST /chat: the conversation is rendered with the model's chat template."""

    messages: list[NativeMessage] = Field(min_length=1)

    def template_messages(self, images: ImageSet) -> list[dict[str, object]]:
        """The messages as the chat template sees them; each image is added to `images`
        and stands as its marker before its message's text. Raises InvalidRequest for an
        image on a non-user turn or a malformed one."""
        messages: list[dict[str, object]] = []
        for index, message in enumerate(self.messages):
            content = message.content
            if message.images:
                param = f"messages[{index}].images"
                if message.role != "user":
                    raise InvalidRequest("only user messages may carry images", param=param)
                refs = [base64_ref(item, f"{param}[{i}]") for i, item in enumerate(message.images)]
                content = "\n".join([*(images.add(ref) for ref in refs), content])
            messages.append({"role": message.role, "content": content})
        return messages


class NativeUsage(_Strict):
    """Token counts of one request."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0, description="prompt tokens served from the prefix cache")


class NativeTimings(_Strict):
    """Latency of one request, measured in the API process from when the route started."""

    ttft_s: float | None = Field(
        ge=0.0, allow_inf_nan=False, description="seconds to the first token; null if none"
    )
    total_s: float = Field(ge=0.0, allow_inf_nan=False, description="seconds to the end")
    draft_n: int = Field(0, ge=0, description="speculative decoding: tokens drafted")
    draft_n_accepted: int = Field(0, ge=0, description="of those, accepted into the output")


RequestIdField = Field(description="the engine's id of this request")
CreatedField = Field(description="unix seconds when the request started")


class NativeGenerateResponse(_Strict):
    """The non-streaming answer of POST /generate."""

    request_id: str = RequestIdField
    object: Literal["generation"] = "generation"
    created: int = CreatedField
    model: str
    text: str
    finish_reason: NativeFinishReason
    usage: NativeUsage
    timings: NativeTimings


class NativeAssistantMessage(_Strict):
    role: Literal["assistant"] = "assistant"
    content: str


class NativeChatResponse(_Strict):
    """The non-streaming answer of POST /chat."""

    request_id: str = RequestIdField
    object: Literal["chat"] = "chat"
    created: int = CreatedField
    model: str
    message: NativeAssistantMessage
    finish_reason: NativeFinishReason
    usage: NativeUsage
    timings: NativeTimings


class NativeStreamEvent(_Strict):
    """One SSE event of a native stream (`data: {...}`).

    Every text piece is one event, `index` counting from 0. The last event has a
    `finish_reason` (its `token` may be empty) and carries `usage` and `timings`; the
    stream ends after it. A failure after the stream started is one `{"error": {...}}`
    event (the OpenAI error envelope) instead.
    """

    request_id: str
    index: int = Field(ge=0)
    token: str
    finish_reason: NativeFinishReason | None = None
    usage: NativeUsage | None = None
    timings: NativeTimings | None = None
