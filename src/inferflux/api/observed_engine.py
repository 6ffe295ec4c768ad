"""`ObservedEngine`: the engine seam, observed.

Owns: wrapping a model's served engine so every generation, whichever API submitted it,
records time to first token, inter-token latency, token counts and finish reasons, feeds
the /debug request tracker, and (with tracing on) runs in a `generate` span whose
context travels to the worker in `AddRequest.trace_context`, with a `stream` span from
the first token to the last. Does not own: the metrics themselves
(observability/metrics.py).

Cost per delta: two `time.monotonic()` calls, a histogram observation and a counter
increment; nothing when metrics are off except the tracker's bounded bookkeeping.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator

import msgspec
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from inferflux.api.request_tracker import TrackedRequest
from inferflux.api.telemetry import Telemetry
from inferflux.engine.messages import AddRequest, FinishReason, RequestDelta
from inferflux.errors import InferfluxError
from inferflux.models.serving import ServedEngine, WrappingEngine
from inferflux.observability.tracing import (
    ATTR_CACHED_TOKENS,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_TOKENS,
    ATTR_MAX_TOKENS,
    ATTR_OPERATION,
    ATTR_OUTPUT_TOKENS,
    ATTR_PRIORITY,
    ATTR_REQUEST_ID,
    ATTR_REQUEST_MODEL,
    ATTR_RESPONSE_ID,
    ATTR_SYSTEM,
    ATTR_TEMPERATURE,
    ATTR_TOP_P,
    SYSTEM,
    inject_context,
)
from inferflux.security.context import RequestContext

_FAILED = frozenset({FinishReason.ERROR, FinishReason.TIMEOUT})

logger = logging.getLogger(__name__)


class _Generation:
    """The observation of one generation: timings, tracker entry, spans."""

    def __init__(
        self, telemetry: Telemetry, model: str, request: AddRequest, context: RequestContext
    ) -> None:
        self.telemetry = telemetry
        self.model = model
        self.started_at = context.started_at
        self.last_token_at: float | None = None
        self.tracked: TrackedRequest = telemetry.tracker.start(
            request, tenant=context.tenant, model=model
        )
        self.span: trace.Span | None = None
        self.stream_span: trace.Span | None = None
        self.finish: FinishReason | None = None
        metrics = telemetry.metrics
        # NOTE: the labelled children are looked up once, not at every token. A request
        # nobody streams has no inter-token latency: its tokens arrive in chunks by design.
        streamed = request.hold_s == 0
        self.itl = metrics.itl.labels(model) if metrics is not None and streamed else None
        self.tokens = metrics.generation_tokens.labels(model) if metrics is not None else None

    def start_span(self, request: AddRequest) -> AddRequest:
        """With tracing on: open the generate span and carry its context to the worker."""
        tracer = self.telemetry.tracer
        if tracer is None:
            return request
        sampling = request.sampling
        self.span = tracer.start_span(
            f"generate {self.model}",
            attributes={
                ATTR_OPERATION: "text_completion",
                ATTR_SYSTEM: SYSTEM,
                ATTR_REQUEST_MODEL: self.model,
                ATTR_RESPONSE_ID: request.request_id,
                ATTR_REQUEST_ID: request.request_id,
                ATTR_PRIORITY: str(request.priority),
                ATTR_MAX_TOKENS: sampling.max_tokens,
                ATTR_TEMPERATURE: sampling.temperature,
                ATTR_TOP_P: sampling.top_p,
                ATTR_INPUT_TOKENS: len(request.prompt_token_ids),
            },
        )
        carrier = inject_context(self.span)
        return msgspec.structs.replace(request, trace_context=carrier)

    def on_delta(self, delta: RequestDelta) -> None:
        now = time.monotonic()
        self.telemetry.tracker.on_delta(self.tracked, delta, now)
        if delta.token_ids:
            self._on_tokens(len(delta.token_ids), now)
        if delta.finish_reason is not None:
            self._on_finish(delta)

    def _on_tokens(self, num_tokens: int, now: float) -> None:
        metrics = self.telemetry.metrics
        if self.last_token_at is None:
            if metrics is not None:
                metrics.ttft.labels(self.model).observe(now - self.started_at)
            if self.span is not None and self.telemetry.tracer is not None:
                self.stream_span = self.telemetry.tracer.start_span(
                    "inferflux.stream", context=trace.set_span_in_context(self.span)
                )
        elif self.itl is not None:
            self.itl.observe(now - self.last_token_at)
        self.last_token_at = now
        if self.tokens is not None:
            self.tokens.inc(num_tokens)

    def _on_finish(self, delta: RequestDelta) -> None:
        self.finish = delta.finish_reason
        metrics = self.telemetry.metrics
        if metrics is not None:
            metrics.prompt_tokens.labels(self.model).inc(delta.num_prompt_tokens)
            metrics.generations.labels(self.model, str(delta.finish_reason)).inc()
        if self.span is not None:
            self.span.set_attributes(
                {
                    ATTR_OUTPUT_TOKENS: delta.num_output_tokens,
                    ATTR_CACHED_TOKENS: delta.num_cached_tokens,
                    ATTR_FINISH_REASONS: [str(delta.finish_reason)],
                }
            )
            if delta.finish_reason in _FAILED:
                self.span.set_status(StatusCode.ERROR, delta.error or str(delta.finish_reason))

    def close(self, error: BaseException | None) -> None:
        """The generation is over, however it ended. An unexpected exception is named by
        its type only: its message could quote the prompt."""
        message = _describe(error)
        tracked = self.tracked
        self.telemetry.tracker.finish(tracked, time.monotonic(), message)
        # One line per generation (sampled by observability.log_sample_rate); no text.
        logger.info(
            "generation %s %s: %d prompt (%d cached) + %d output tokens, first token %s, %.3fs",
            tracked.request_id,
            tracked.finish_reason,
            tracked.num_prompt_tokens,
            tracked.num_cached_tokens,
            tracked.num_output_tokens,
            "-" if tracked.first_token_s is None else f"{tracked.first_token_s:.3f}s",
            tracked.finished_s or 0.0,
        )
        if self.stream_span is not None:
            self.stream_span.end()
        if self.span is not None:
            if isinstance(error, InferfluxError):
                self.span.record_exception(error)
            if message is not None:
                self.span.set_status(StatusCode.ERROR, message)
            elif self.finish is None:
                self.span.set_attribute(ATTR_FINISH_REASONS, ["abort"])
            self.span.end()


def _describe(error: BaseException | None) -> str | None:
    if error is None:
        return None
    if isinstance(error, InferfluxError):
        return f"{type(error).__name__}: {error.message}"
    return type(error).__name__


class ObservedEngine(WrappingEngine):
    """A served engine that observes every generation of the one it wraps (and feeds
    every step of its workers to the telemetry's exporter)."""

    def __init__(self, inner: ServedEngine, telemetry: Telemetry, model: str) -> None:
        super().__init__(inner)
        self.telemetry = telemetry
        self.model = model
        inner.observe_steps(telemetry.on_step)

    async def generate(
        self, request: AddRequest, context: RequestContext
    ) -> AsyncIterator[RequestDelta]:
        observed = _Generation(self.telemetry, self.model, request, context)
        request = observed.start_span(request)
        deltas = self.inner.generate(request, context)
        error: BaseException | None = None
        try:
            async for delta in deltas:
                observed.on_delta(delta)
                yield delta
        except Exception as exc:
            error = exc
            raise
        finally:
            # NOTE: close the engine's generator now (it aborts an unfinished request),
            # not whenever it is garbage-collected.
            if isinstance(deltas, AsyncGenerator):
                await deltas.aclose()
            observed.close(error)
