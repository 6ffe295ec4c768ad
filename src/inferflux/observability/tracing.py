"""OpenTelemetry tracing: the tracer provider of a process and W3C trace-context carriers.

Owns: `make_tracer_provider` (settings → an SDK `TracerProvider` with the configured
exporter, or None for `exporter: none`), the propagation helpers that move a span's
context through the IPC `AddRequest` (`inject_context` / `extract_context`), and the
attribute names spans share. Does not own: which spans exist (the API's middleware and
engine wrapper, and the worker's `engine/spans.py`).

No global provider is installed: each app and each worker holds its own, so tests can
build many apps with different exporters in one process, and `exporter: none` means no
provider, no spans and no per-request cost at all.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from inferflux import __version__
from inferflux.config.settings import TracingSettings

TRACER_NAME = "inferflux"

# GenAI semantic conventions (opentelemetry.io/docs/specs/semconv/gen-ai/) where they exist;
# `inferflux.*` for what they do not cover.
ATTR_OPERATION = "gen_ai.operation.name"
ATTR_SYSTEM = "gen_ai.system"
ATTR_REQUEST_MODEL = "gen_ai.request.model"
ATTR_RESPONSE_ID = "gen_ai.response.id"
ATTR_MAX_TOKENS = "gen_ai.request.max_tokens"
ATTR_TEMPERATURE = "gen_ai.request.temperature"
ATTR_TOP_P = "gen_ai.request.top_p"
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ATTR_FINISH_REASONS = "gen_ai.response.finish_reasons"
ATTR_REQUEST_ID = "inferflux.request_id"
ATTR_PRIORITY = "inferflux.priority"
ATTR_CACHED_TOKENS = "inferflux.cached_tokens"
ATTR_WORKER = "inferflux.worker_id"
SYSTEM = "llama.cpp"

_PROPAGATOR = TraceContextTextMapPropagator()


def make_tracer_provider(
    settings: TracingSettings, *, component: str, exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """The provider for one process part (`component`: "api" or "worker-N"), or None when
    tracing is off. `exporter` replaces the configured one (tests pass an in-memory one).

    Side effects: none until spans end; the batch processor's thread starts lazily.
    Call `shutdown()` on the provider to flush it.
    """
    if exporter is None:
        if settings.exporter == "none":
            return None
        exporter = _exporter(settings)
    resource = Resource.create(
        {
            "service.name": settings.service_name,
            "service.version": __version__,
            "inferflux.component": component,
        }
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio))
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter(settings: TracingSettings) -> SpanExporter:
    if settings.exporter == "console":
        return ConsoleSpanExporter()
    # NOTE: imported here: the OTLP exporter pulls in protobuf and requests, which a
    # server without tracing never needs.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.otlp_endpoint, timeout=settings.otlp_timeout_s)


def get_tracer(provider: TracerProvider | None) -> trace.Tracer | None:
    """The InferFlux tracer of `provider` (None when tracing is off)."""
    if provider is None:
        return None
    return provider.get_tracer(TRACER_NAME, __version__)


def inject_context(span: trace.Span) -> dict[str, str]:
    """The W3C carrier (`traceparent`, maybe `tracestate`) that makes `span` a parent."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def extract_context(carrier: Mapping[str, str]) -> Context:
    """The context a carrier describes (an empty one when it holds no valid traceparent)."""
    return _PROPAGATOR.extract(dict(carrier))
