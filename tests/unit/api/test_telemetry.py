"""Telemetry of the HTTP edge over the fake engine: request metrics by route template and
status, TTFT / ITL / token counters from deltas, StepStats → engine histograms and
throughput, /debug/requests, and the spans of one request (in-memory exporter)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from inferflux.api import create_app
from inferflux.config.settings import Settings, TracingSettings
from inferflux.engine.messages import Admission, RequestPhases, StepStats
from inferflux.observability.tracing import make_tracer_provider
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info
from tests.openai_envelope import assert_envelope

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}]}


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_chat_request_is_counted_by_route_template_and_status(
    client: httpx.AsyncClient,
) -> None:
    assert (await client.post(CHAT, json=BODY)).status_code == 200
    samples = await scrape(client)
    labels = {"model": "fake-model", "route": CHAT, "status": "200"}
    assert sample(samples, "inferflux_requests_total", **labels) == 1
    assert sample(samples, "inferflux_request_latency_seconds_count", **labels) == 1
    assert sample(samples, "inferflux_time_to_first_token_seconds_count", model="fake-model") == 1
    # nobody streamed it: its tokens come in chunks by design, no inter-token latency
    assert sample(samples, "inferflux_inter_token_latency_seconds_count", model="fake-model") == 0
    assert sample(samples, "inferflux_generation_tokens_total", model="fake-model") == 4
    assert sample(samples, "inferflux_prompt_tokens_total", model="fake-model") > 0
    reason = {"model": "fake-model", "finish_reason": "stop"}
    assert sample(samples, "inferflux_generations_total", **reason) == 1
    assert sample(samples, "inferflux_stream_tokens_total", model="fake-model") == 0


async def test_streamed_tokens_and_cache_hits_are_counted(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.num_cached_tokens = 5
    response = await client.post(CHAT, json={**BODY, "stream": True})
    assert response.status_code == 200
    samples = await scrape(client)
    assert sample(samples, "inferflux_stream_tokens_total", model="fake-model") == 4
    assert sample(samples, "inferflux_stream_cache_hits_total", model="fake-model") == 1
    # four one-token deltas: three gaps between them
    assert sample(samples, "inferflux_inter_token_latency_seconds_count", model="fake-model") == 3


async def test_unknown_paths_and_rejected_bodies_keep_labels_bounded(
    client: httpx.AsyncClient,
) -> None:
    for i in range(3):
        assert (await client.get(f"/no/such/path/{i}")).status_code == 404
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    assert (await client.post(CHAT, json=big)).status_code == 413
    samples = await scrape(client)
    unmatched = {"model": "fake-model", "route": "unmatched", "status": "404"}
    assert sample(samples, "inferflux_requests_total", **unmatched) == 3
    assert sample(samples, "inferflux_request_errors_total", **unmatched) == 3
    # answered before routing: no route template to name
    too_large = {"model": "fake-model", "route": "unmatched", "status": "413"}
    assert sample(samples, "inferflux_requests_total", **too_large) == 1
    assert not any("/no/such" in str(labels) for _, labels in samples)


async def test_step_stats_feed_engine_histograms_and_throughput(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    step = StepStats(
        step_exec_s=[0.02, 0.03],
        step_num_seqs=[2, 1],
        step_num_tokens=[40, 1],
        num_prompt_tokens=40,
        num_generated_tokens=3,
        admitted=[Admission("r1", "high", 0.5)],
        finished=[
            RequestPhases("r1", "high", 10.0, 10.5, 11.0, 12.5, 40, 0, 3, "stop"),
            RequestPhases("r2", "low", 10.0, None, None, 20.0, 8, 0, 0, "timeout"),
        ],
    )
    engine.emit_step(step)
    samples = await scrape(client)
    assert sample(samples, "inferflux_batch_exec_seconds_count") == 2
    assert sample(samples, "inferflux_batch_size_sum") == 3
    assert sample(samples, "inferflux_batch_tokens_sum") == 41
    assert sample(samples, "inferflux_queue_wait_seconds_sum", priority="high") == 0.5
    assert sample(samples, "inferflux_prefill_duration_seconds_sum", priority="high") == 0.5
    assert sample(samples, "inferflux_decode_duration_seconds_sum", priority="high") == 1.5
    assert sample(samples, "inferflux_prefill_duration_seconds_count", priority="low") == 0
    assert sample(samples, "inferflux_prefill_tokens_total") == 40
    stats = (await client.get("/server/stats")).json()
    assert stats["throughput"]["10s"]["prompt_tokens_per_s"] == 4.0
    assert stats["throughput"]["1m"]["generation_tokens_per_s"] == 0.05


async def test_server_stats_shape(client: httpx.AsyncClient) -> None:
    stats = (await client.get("/server/stats")).json()
    assert stats["queue_depth_by_priority"] == {"high": 0, "normal": 0, "low": 0}
    assert stats["active_batches"] == 1 and stats["num_running"] == 1
    assert stats["prefix_cache"] is None  # the fake's workers have no cache
    assert set(stats["throughput"]) == {"10s", "1m"}
    (worker,) = stats["workers"]
    assert worker["load_s"] == 0.5 and worker["busy"] is True


async def test_debug_requests_lists_finished_requests_with_a_token_trace(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(CHAT, json=BODY)
    request_id = response.json()["id"].removeprefix("chatcmpl-")
    listing = (await client.get("/debug/requests")).json()
    assert listing["active"] == []
    (recent,) = [r for r in listing["recent"] if request_id in r["request_id"]]
    assert recent["phase"] == "finished" and recent["finish_reason"] == "stop"
    assert recent["num_output_tokens"] == 4 and recent["time_to_first_token_s"] is not None
    detail = (await client.get(f"/debug/requests/{recent['request_id']}")).json()
    assert [e["token_ids"] for e in detail["trace"]] == [[7]] * 4
    assert all(e["text"] is None for e in detail["trace"])  # debug_prompts is off
    times = [e["at_s"] for e in detail["trace"]]
    assert times == sorted(times)


@pytest.mark.parametrize("request_id", ["nope", "%E2%9C%93" * 40, "a%2Fb"])
async def test_debug_request_unknown_id_is_404(client: httpx.AsyncClient, request_id: str) -> None:
    response = await client.get(f"/debug/requests/{request_id}")
    assert_envelope(response, 404, code="not_found")


async def _app(settings: Settings, engine: FakeEngineClient, **kwargs) -> FastAPI:
    return create_app(
        settings, engine=engine, tokenizer=FakeTokenizer(), model_info=fake_model_info(), **kwargs
    )


class Traced:
    def __init__(self, client, engine, exporter, provider) -> None:
        self.client, self.engine = client, engine
        self._exporter, self._provider = exporter, provider

    def spans(self) -> dict:
        self._provider.force_flush()
        return {s.name: s for s in self._exporter.get_finished_spans()}


@pytest.fixture
async def traced() -> AsyncIterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider(TracingSettings(), component="api", exporter=exporter)
    engine = FakeEngineClient()
    settings = Settings.model_validate({"observability": {"debug_prompts": True}})
    app = await _app(settings, engine, tracer_provider=provider)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield Traced(client, engine, exporter, provider)


async def test_one_request_is_one_trace_from_http_to_stream(traced) -> None:
    client, engine = traced.client, traced.engine
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    response = await client.post(CHAT, json={**BODY, "stream": True}, headers=headers)
    assert response.status_code == 200
    client_trace = int(trace_id, 16)
    spans = traced.spans()
    http = spans[f"POST {CHAT}"]
    assert http.kind is SpanKind.SERVER and http.context.trace_id == client_trace
    assert http.parent.span_id == 0x00F067AA0BA902B7  # continues the client's trace
    assert http.attributes["http.response.status_code"] == 200
    assert http.attributes["http.route"] == CHAT
    tokenize, generate = spans["inferflux.tokenize"], spans["generate fake-model"]
    stream = spans["inferflux.stream"]
    assert tokenize.parent.span_id == http.context.span_id
    assert generate.parent.span_id == http.context.span_id
    assert stream.parent.span_id == generate.context.span_id
    assert {s.context.trace_id for s in spans.values()} == {client_trace}
    attributes = generate.attributes
    assert attributes["gen_ai.request.model"] == "fake-model"
    assert attributes["gen_ai.usage.output_tokens"] == 4
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert tuple(attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    # the worker gets the generate span as its parent
    (request,) = engine.requests
    traceparent = request.trace_context["traceparent"]
    assert traceparent.split("-")[1:3] == [trace_id, f"{generate.context.span_id:016x}"]


async def test_debug_prompts_shows_token_text(traced) -> None:
    client = traced.client
    await client.post(CHAT, json=BODY)
    (recent,) = (await client.get("/debug/requests")).json()["recent"]
    detail = (await client.get(f"/debug/requests/{recent['request_id']}")).json()
    assert "".join(e["text"] for e in detail["trace"]) == "Hello, world!"


async def test_without_tracing_no_context_is_sent(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    await client.post(CHAT, json=BODY)
    assert engine.requests[0].trace_context is None


async def test_metrics_can_be_turned_off() -> None:
    settings = Settings.model_validate({"observability": {"metrics": {"enabled": False}}})
    engine = FakeEngineClient()
    app = await _app(settings, engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.post(CHAT, json=BODY)).status_code == 200
            assert_envelope(await client.get("/metrics"), 404, code="not_found")
            engine.emit_step(StepStats(num_prompt_tokens=3))  # still feeds /server/stats
            assert (await client.get("/server/stats")).status_code == 200


async def test_an_engine_failure_is_a_finished_error_in_debug(
    client: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.raise_after = (2, RuntimeError("boom"))
    response = await client.post(CHAT, json=BODY)
    assert response.status_code == 500
    (recent,) = (await client.get("/debug/requests")).json()["recent"]
    assert recent["phase"] == "finished" and recent["finish_reason"] == "error"
    assert recent["num_output_tokens"] == 2
    samples = await scrape(client)
    assert sample(samples, "inferflux_requests_total", model="fake-model", route=CHAT,
                  status="500") == 1  # fmt: skip


async def test_each_generation_logs_one_line_without_text(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="inferflux.api.observed_engine"):
        await client.post(CHAT, json={"messages": [{"role": "user", "content": "secret words"}]})
    (line,) = [r.getMessage() for r in caplog.records if r.name == "inferflux.api.observed_engine"]
    assert " stop: " in line and "+ 4 output tokens" in line
    assert "secret" not in line and "Hello" not in line


@pytest.mark.parametrize(
    "traceparent", ["garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", b"\xe9\xff"]
)
async def test_a_malformed_traceparent_starts_a_fresh_trace(traced, traceparent) -> None:
    response = await traced.client.post(CHAT, json=BODY, headers={"traceparent": traceparent})
    assert response.status_code == 200
    http = traced.spans()[f"POST {CHAT}"]
    assert http.parent is None and http.context.trace_id != 0
