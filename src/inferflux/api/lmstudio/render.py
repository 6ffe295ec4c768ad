"""LM Studio's additions to an OpenAI answer: `stats`, `model_info`, `runtime`.

Owns `LmStudioRenderer`, the `Decorate` (api/openai/render.py) the LM Studio routes give
the OpenAI handlers: the same SSE chunks when streaming (LM Studio's streams are OpenAI's),
and for a collected answer OpenAI's body plus

- `stats`: `tokens_per_second` (completion tokens over `generation_time`),
  `time_to_first_token` (seconds from the request's start to its first output token),
  `generation_time` (seconds from the first output token to the last), `stop_reason`
  (LM Studio's names: `eosFound`, `stopStringFound`, `maxPredictedTokensReached`,
  `toolCalls`; else InferFlux's finish reason);
- `model_info`: `arch`, `quant`, `format` ("gguf"), `context_length` (the per-request
  context InferFlux serves);
- `runtime`: `name`, `version` (InferFlux's), `supported_formats`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec
from starlette.responses import Response

from inferflux import __version__
from inferflux.api.generation import (
    Generation,
    GenerationEvent,
    GenerationResult,
    Timings,
)
from inferflux.api.openai.render import OpenAIRenderer
from inferflux.api.sse import EventStreamResponse
from inferflux.engine.messages import FinishReason
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import InferfluxError

RUNTIME = {"name": "inferflux-llama.cpp", "version": __version__, "supported_formats": ["gguf"]}
_STOP_REASONS = {
    FinishReason.STOP: "eosFound",
    FinishReason.STOP_SEQUENCE: "stopStringFound",
    FinishReason.LENGTH: "maxPredictedTokensReached",
}
_NS = 1e9


def model_info_of(info: ModelInfo) -> dict[str, object]:
    return {
        "arch": info.architecture,
        "quant": info.quantization,
        "format": "gguf",
        "context_length": info.n_ctx,
    }


def stats_of(result: GenerationResult) -> dict[str, object]:
    """LM Studio's `stats` of a finished generation (module docstring)."""
    timings: Timings = result.timings
    first_ns = timings.first_token_ns or timings.first_delta_ns
    generation_s = max(timings.last_delta_ns - first_ns, 0) / _NS
    num_tokens = result.usage.completion_tokens
    first = result.choices[0] if result.choices else None
    stop_reason = "unknown"
    if first is not None:
        stop_reason = _STOP_REASONS.get(first.finish_reason, str(first.finish_reason))
        if first.num_tool_calls:
            stop_reason = "toolCalls"
    return {
        "tokens_per_second": round(num_tokens / generation_s, 3) if generation_s > 0 else 0.0,
        "time_to_first_token": round(max(first_ns - timings.started_ns, 0) / _NS, 4),
        "generation_time": round(generation_s, 4),
        "stop_reason": stop_reason,
    }


class LmStudioRenderer:
    """An OpenAI renderer whose collected answer carries LM Studio's additions."""

    def __init__(self, inner: OpenAIRenderer, info: ModelInfo) -> None:
        self.inner = inner
        self.info = info

    @property
    def stream_response(self) -> type[EventStreamResponse]:
        return self.inner.stream_response

    def frames(self, event: GenerationEvent) -> Sequence[bytes]:
        return self.inner.frames(event)

    def error_frame(self, error: InferfluxError) -> bytes:
        return self.inner.error_frame(error)

    def end_frames(self) -> Sequence[bytes]:
        return self.inner.end_frames()

    def response(self, result: GenerationResult) -> Response:
        body = msgspec.json.decode(self.inner.response(result).body)
        body["stats"] = stats_of(result)
        body["model_info"] = model_info_of(self.info)
        body["runtime"] = RUNTIME
        return Response(msgspec.json.encode(body), media_type="application/json")


def lmstudio_renderer(info: ModelInfo) -> Callable[[Generation, OpenAIRenderer], LmStudioRenderer]:
    """The `Decorate` of the LM Studio routes for the model `info` describes."""

    def decorate(generation: Generation, renderer: OpenAIRenderer) -> LmStudioRenderer:
        return LmStudioRenderer(renderer, info)

    return decorate
