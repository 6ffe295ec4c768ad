"""Tracer providers per settings, and the W3C carrier that crosses the IPC boundary."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferflux.config.settings import TracingSettings
from inferflux.observability.tracing import (
    extract_context,
    get_tracer,
    inject_context,
    make_tracer_provider,
)


def test_exporter_none_means_no_provider_and_no_tracer() -> None:
    provider = make_tracer_provider(TracingSettings(), component="api")
    assert provider is None and get_tracer(provider) is None


def test_console_and_otlp_exporters_build() -> None:
    for exporter in ("console", "otlp"):
        provider = make_tracer_provider(TracingSettings(exporter=exporter), component="api")
        assert provider is not None
        provider.shutdown()


def test_a_span_context_survives_inject_then_extract() -> None:
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider(TracingSettings(), component="worker-0", exporter=exporter)
    tracer = get_tracer(provider)
    parent = tracer.start_span("generate")
    carrier = inject_context(parent)
    assert set(carrier) == {"traceparent"}
    child = tracer.start_span("inferflux.engine", context=extract_context(carrier))
    child.end()
    parent.end()
    provider.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["inferflux.engine"].parent.span_id == spans["generate"].context.span_id
    assert spans["inferflux.engine"].context.trace_id == spans["generate"].context.trace_id
    assert spans["generate"].resource.attributes["inferflux.component"] == "worker-0"
    provider.shutdown()


def test_a_malformed_carrier_gives_a_fresh_root() -> None:
    context = extract_context({"traceparent": "not-a-trace"})
    assert not trace.get_current_span(context).get_span_context().is_valid


def test_sample_ratio_zero_records_nothing() -> None:
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider(
        TracingSettings(sample_ratio=0.0), component="api", exporter=exporter
    )
    get_tracer(provider).start_span("x").end()
    provider.force_flush()
    assert exporter.get_finished_spans() == ()
    provider.shutdown()
