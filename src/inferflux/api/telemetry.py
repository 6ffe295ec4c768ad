"""The API process's telemetry: one `Telemetry` per app, and the middleware that feeds it.

Owns: `Telemetry` (the app's metrics, tracer, request tracker and throughput meter, and
`on_step`, the exporter that maps each worker's `StepStats` to them), `tokenize_span`, and
`TelemetryMiddleware` (pure ASGI: request latency and counts by route template and
status, the HTTP server span, streamed-token counts read from the request's record).
Does not own: metric definitions (observability/metrics.py) or the engine wrapper
(api/observed_engine.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from contextvars import Token
from dataclasses import dataclass, field

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferflux import __version__
from inferflux.api.request_tracker import RequestTracker
from inferflux.config.settings import Settings
from inferflux.engine.messages import StepStats
from inferflux.engine.protocol import ChannelStats, ModelInfo, WorkerStatus
from inferflux.observability.metrics import Metrics
from inferflux.observability.throughput import ThroughputMeter
from inferflux.observability.tracing import (
    ATTR_REQUEST_ID,
    extract_context,
    get_tracer,
    make_tracer_provider,
)
from inferflux.observability.usage import UsageLedger
from inferflux.security.context import RequestContext, context_of

_STREAM_TYPES = (b"text/event-stream", b"application/x-ndjson", b"application/grpc")


def tokenize_span(tracer: trace.Tracer | None, num_chars: int) -> AbstractContextManager[object]:
    """An `inferflux.tokenize` span around a tokenization (a child of the request's HTTP
    span) while tracing is on (`tracer`); otherwise a no-op."""
    if tracer is None:
        return contextlib.nullcontext()
    attributes = {"inferflux.num_chars": num_chars}
    return tracer.start_as_current_span("inferflux.tokenize", attributes=attributes)


@dataclass(slots=True)
class Telemetry:
    """Everything the app observes with. `metrics` is None when metrics are off, `tracer`
    None when tracing is off; `tracker` and `meter` always run (bounded memory)."""

    metrics: Metrics | None
    tracker: RequestTracker
    provider: TracerProvider | None = None
    meter: ThroughputMeter = field(default_factory=ThroughputMeter)
    usage: UsageLedger = field(default_factory=UsageLedger)  # GET /v1/admin/usage
    tracer: trace.Tracer | None = field(init=False)

    def __post_init__(self) -> None:
        self.tracer = get_tracer(self.provider)

    def on_step(self, worker_id: int, step: StepStats) -> None:
        """The exporter: one worker's `StepStats` → histograms, throughput, /debug phases."""
        self.meter.add(step.num_prompt_tokens, step.num_generated_tokens)
        self._track(step)
        metrics = self.metrics
        if metrics is None:
            return
        if step.num_prompt_tokens:
            metrics.prefill_tokens.inc(step.num_prompt_tokens)
        for exec_s, num_seqs, num_tokens in zip(
            step.step_exec_s, step.step_num_seqs, step.step_num_tokens, strict=True
        ):
            metrics.observe_step(exec_s, num_seqs, num_tokens)
        for admission in step.admitted:
            metrics.queue_wait.labels(admission.priority).observe(admission.queue_wait_s)
        for p in step.finished:
            prefill_s = decode_s = None
            if p.scheduled_at is not None:
                prefill_end = p.first_token_at if p.first_token_at is not None else p.finished_at
                prefill_s = prefill_end - p.scheduled_at
            if p.first_token_at is not None:
                decode_s = p.finished_at - p.first_token_at
            metrics.observe_phases(p.priority, prefill_s, decode_s)
        if step.transfer_s:
            metrics.observe_transfers(step.transfer_s)

    def _track(self, step: StepStats) -> None:
        """The worker's admissions and finished requests' phases → /debug/requests."""
        for admission in step.admitted:
            self.tracker.on_admitted(admission.request_id, admission.queue_wait_s)
        for phases in step.finished:
            self.tracker.on_phases(phases)

    def shutdown(self) -> None:
        """Flush and stop the span exporter (idempotent)."""
        if self.provider is not None:
            self.provider.shutdown()
            self.provider = None
            self.tracer = None


def make_telemetry(
    settings: Settings,
    workers: Callable[[], Sequence[WorkerStatus]],
    model_info: ModelInfo,
    provider: TracerProvider | None = None,
    channels: Callable[[], Sequence[ChannelStats]] = tuple,
) -> Telemetry:
    """The app's telemetry per `settings.observability`. `workers` lists every engine
    worker (of every model) at scrape time, `channels` every model's KV channel
    (disaggregated mode); `model_info` is the default model's (the `model` label of HTTP
    metrics). `provider` replaces the tracer provider the settings describe (tests pass
    one with an in-memory exporter)."""
    obs = settings.observability
    metrics = None
    if obs.metrics.enabled:
        info = {
            "backend": "llama.cpp",
            "device": "gpu" if settings.runtime.n_gpu_layers != 0 else "cpu",
            "mode": "in_process" if settings.runtime.in_process else "workers",
            "model": model_info.model_id,
            "version": __version__,
        }
        metrics = Metrics(model=model_info.model_id, info=info, workers=workers, channels=channels)
        if settings.scheduler.mode == "disaggregated":
            metrics.init_transfer()
    if provider is None:
        provider = make_tracer_provider(obs.tracing, component="api")
    tracker = RequestTracker(
        history=obs.debug_history, max_events=obs.debug_trace_events, keep_text=obs.debug_prompts
    )
    return Telemetry(metrics=metrics, tracker=tracker, provider=provider)


class TelemetryMiddleware:
    """Pure ASGI, just inside the request-id middleware: times every HTTP request until
    its last body byte, labels it by route template (never the raw path) and status, and
    wraps it in a SERVER span that continues a client's `traceparent`."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        context = context_of(scope)
        status = 500  # until a response starts: an exception nobody answered
        streaming = False

        async def send_observed(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = message["status"]
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                streaming = content_type.startswith(_STREAM_TYPES)
            await send(message)

        span, context_token = self._start_span(scope)
        metrics = self.telemetry.metrics
        if metrics is not None:
            metrics.requests_in_flight.inc()
        try:
            await self.app(scope, receive, send_observed)
        finally:
            route = context.route
            _count_usage(self.telemetry.usage, context)
            if metrics is not None:
                record = context.record
                metrics.requests_in_flight.dec()
                metrics.observe_request(route, status, time.monotonic() - context.started_at)
                if streaming:
                    metrics.stream_tokens.labels(metrics.model).inc(record.num_completion_tokens)
                    metrics.stream_cache_hits.labels(metrics.model).inc(record.num_cache_hits)
            if span is not None:
                _end_span(span, route, status, scope)
            if context_token is not None:
                otel_context.detach(context_token)

    def _start_span(self, scope: Scope) -> tuple[trace.Span | None, Token[Context] | None]:
        tracer = self.telemetry.tracer
        if tracer is None:
            return None, None
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate")
        }
        method = scope.get("method", "GET")
        span = tracer.start_span(
            method,
            context=extract_context(headers),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.path": scope.get("path", ""),
                ATTR_REQUEST_ID: scope.get("state", {}).get("request_id", ""),
            },
        )
        return span, otel_context.attach(trace.set_span_in_context(span))


def _count_usage(usage: UsageLedger, context: RequestContext) -> None:
    """One row of the usage ledger for a request that reached a model."""
    record, principal = context.record, context.principal
    if record.model is not None and principal is not None:
        usage.add(
            principal.subject,
            principal.tenant,
            record.model,
            record.num_prompt_tokens,
            record.num_completion_tokens,
        )


def _end_span(span: trace.Span, route: str, status: int, scope: Scope) -> None:
    span.update_name(f"{scope.get('method', 'GET')} {route}")
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(StatusCode.ERROR)
    span.end()
