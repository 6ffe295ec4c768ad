"""Traces end to end: a real server exports OTLP/HTTP to a loopback receiver.

The receiver is a plain HTTP server started by the test that decodes each POST /v1/traces
body as an OTLP `ExportTraceServiceRequest` (protobuf). The server runs with
`observability.tracing.exporter: otlp`; a chat request that carries a client
`traceparent` must come back as one trace: the API process's HTTP, tokenize, generate and
stream spans, and the worker process's engine, queue, prefill and decode spans, joined
through the trace context carried in the IPC AddRequest.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.integration.conftest import SERVER_START_TIMEOUT_S
from tests.integration.server_process import serving

pytestmark = [pytest.mark.model, pytest.mark.server]

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"
WAIT_S = 60.0


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    component: str
    service: str
    attributes: dict[str, object]


class _Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[ReceivedSpan] = []
        self.content_types: set[str] = set()
        self.lock = threading.Lock()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            ReceivedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                component=str(resource.get("inferflux.component")),
                                service=str(resource.get("service.name")),
                                attributes=_attributes(span.attributes),
                            )
                        )


def _attributes(pairs) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        value = getattr(pair.value, kind) if kind else None
        if kind == "array_value":
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        out[pair.key] = value
    return out


class _Handler(BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.content_types.add(self.headers.get("content-type", ""))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        self.server.add(ExportTraceServiceRequest.FromString(body))
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep the test output clean


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _tracing_env(receiver: _Receiver) -> dict[str, str]:
    port = receiver.server_address[1]
    return {
        "INFERFLUX_OBSERVABILITY__TRACING__EXPORTER": "otlp",
        "INFERFLUX_OBSERVABILITY__TRACING__OTLP_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # export batches every 200 ms, not every 5 s
    }


@pytest.fixture
def traced_server(receiver: _Receiver, tmp_path) -> Iterator[str]:
    yield from _serve(_tracing_env(receiver), tmp_path)


def _serve(env: dict[str, str], tmp_path) -> Iterator[str]:
    with serving(env, tmp_path / "server.log", SERVER_START_TIMEOUT_S) as url:
        yield url


def _trace(receiver: _Receiver, names: set[str]) -> dict[str, ReceivedSpan]:
    """The client's trace once every span in `names` and the API's `generate <model>`
    span arrived (bounded wait: each process exports its spans in its own batches, so
    the worker's may come first)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        with receiver.lock:
            spans = {s.name: s for s in receiver.spans if s.trace_id == TRACE_ID}
        if names <= set(spans) and any(name.startswith("generate ") for name in spans):
            return spans
        time.sleep(0.2)
    raise TimeoutError(
        f"spans missing after {WAIT_S:g}s: {sorted(names - set(spans))} (or generate)"
    )


def test_one_request_is_one_trace_across_api_and_worker(
    traced_server: str, receiver: _Receiver
) -> None:
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"}
    body = {
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 4,
        "stream": True,
    }
    response = httpx.post(
        f"{traced_server}/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert response.status_code == 200, response.text

    api_names = {"POST /v1/chat/completions", "inferflux.tokenize", "inferflux.stream"}
    worker_names = {"inferflux.engine", "inferflux.queue", "inferflux.prefill", "inferflux.decode"}
    spans = _trace(receiver, api_names | worker_names)
    generate = next(s for name, s in spans.items() if name.startswith("generate "))

    http = spans["POST /v1/chat/completions"]
    assert http.parent_span_id == CLIENT_SPAN_ID  # continues the client's trace
    assert http.attributes["http.response.status_code"] == 200
    assert spans["inferflux.tokenize"].parent_span_id == http.span_id
    assert generate.parent_span_id == http.span_id
    assert spans["inferflux.stream"].parent_span_id == generate.span_id
    for name in api_names:
        assert spans[name].component == "api" and spans[name].service == "inferflux"
    assert generate.component == "api"

    engine = spans["inferflux.engine"]
    assert engine.parent_span_id == generate.span_id  # joined across the process boundary
    assert engine.component == "worker-0"
    for name in ("inferflux.queue", "inferflux.prefill", "inferflux.decode"):
        assert spans[name].parent_span_id == engine.span_id
        assert spans[name].component == "worker-0"
    assert (
        generate.attributes["gen_ai.usage.input_tokens"]
        == engine.attributes["gen_ai.usage.input_tokens"]
    )
    assert 1 <= engine.attributes["gen_ai.usage.output_tokens"] <= 4
    assert generate.attributes["gen_ai.request.model"].startswith("SmolLM2")
    assert receiver.content_types == {"application/x-protobuf"}


def test_a_handed_off_request_traces_its_kv_transfer(receiver: _Receiver, tmp_path) -> None:
    env = _tracing_env(receiver) | {"INFERFLUX_SCHEDULER__MODE": "disaggregated"}
    for url in _serve(env, tmp_path):
        # /readyz answers once the decode worker is ready; a request sent before the
        # prefill worker is would run direct (no hand-off, no transfer span)
        deadline = time.monotonic() + WAIT_S
        while httpx.get(f"{url}/readyz").json()["pools"]["prefill"]["ready"] < 1:
            assert time.monotonic() < deadline, "the prefill worker never became ready"
            time.sleep(0.1)
        headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"}
        body = {"messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 4}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        spans = _trace(receiver, {"inferflux.kv_transfer", "inferflux.decode"})
        with receiver.lock:
            engines = [s for s in receiver.spans if s.name == "inferflux.engine"]
        # one engine span per leg: worker 0 prefills (and hands off), worker 1 decodes
        assert {s.component for s in engines} == {"worker-0", "worker-1"}
        assert {s.attributes["gen_ai.response.finish_reasons"][0] for s in engines} >= {"handoff"}
        transfer = spans["inferflux.kv_transfer"]
        generate = next(s for name, s in spans.items() if name.startswith("generate "))
        assert transfer.parent_span_id == generate.span_id
        assert transfer.component == "worker-1"
        assert transfer.attributes["inferflux.kv_transfer.bytes"] > 0
