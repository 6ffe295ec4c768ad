"""Headers, stream-cut tails and event cutting of the router (pure logic)."""

from __future__ import annotations

import json

from inferflux.router.health import read_load
from inferflux.router.wire import (
    EventCutter,
    request_headers,
    response_headers,
    stream_cut_tail,
)


def test_request_headers_drop_hop_by_hop_and_keep_credentials():
    raw = [
        (b"host", b"router:8090"),
        (b"connection", b"keep-alive, x-private"),
        (b"x-private", b"1"),
        (b"authorization", b"Bearer k"),
        (b"content-length", b"12"),
        (b"transfer-encoding", b"chunked"),
        (b"content-type", b"application/json"),
    ]
    assert request_headers(raw) == [
        (b"authorization", b"Bearer k"),
        (b"content-type", b"application/json"),
    ]


def test_response_headers_name_the_replica_by_index():
    out = response_headers([(b"transfer-encoding", b"chunked"), (b"x-request-id", b"r")], 2)
    assert out == [(b"x-request-id", b"r"), (b"x-inferflux-replica", b"2")]


def _events(tail: bytes) -> list[bytes]:
    return [e for e in tail.split(b"\n\n") if e]


def test_openai_stream_cut_ends_with_error_then_done():
    events = _events(stream_cut_tail("/v1/chat/completions", "text/event-stream; charset=utf-8"))
    assert events[-1] == b"data: [DONE]"
    error = json.loads(events[0].removeprefix(b"data: "))["error"]
    assert error["code"] == "worker_died" and error["type"] == "server_error"


def test_native_anthropic_responses_and_ollama_tails():
    native = _events(stream_cut_tail("/generate", "text/event-stream"))
    assert len(native) == 1 and b"[DONE]" not in native[0]
    anthropic = stream_cut_tail("/v1/messages", "text/event-stream")
    assert anthropic.startswith(b"event: error\ndata: ")
    assert json.loads(anthropic.split(b"data: ", 1)[1])["type"] == "error"
    responses = stream_cut_tail("/v1/responses", "text/event-stream")
    assert json.loads(responses.split(b"data: ", 1)[1])["code"] == "worker_died"
    line = stream_cut_tail("/api/chat", "application/x-ndjson")
    assert line.endswith(b"\n") and "error" in json.loads(line)
    assert stream_cut_tail("/v1/models", "application/json") == b""


def test_event_cutter_holds_back_an_unfinished_event():
    cutter = EventCutter("text/event-stream")
    assert cutter.feed(b"data: 1\n\ndata: 2") == b"data: 1\n\n"
    assert cutter.feed(b"2\n\n") == b"data: 22\n\n"
    assert cutter.feed(b"data: 3") == b""
    assert cutter.rest() == b"data: 3"
    lines = EventCutter("application/x-ndjson")
    assert lines.feed(b'{"a":1}\n{"b"') == b'{"a":1}\n'


def test_read_load_sums_the_three_gauges():
    text = "\n".join(
        [
            "# HELP inferflux_scheduler_queue_depth Waiting",
            "inferflux_scheduler_queue_depth 3.0",
            'inferflux_scheduler_queue_depth_by_priority{priority="high"} 9.0',
            'inferflux_running_sequences{worker="0"} 2.0',
            'inferflux_running_sequences{worker="1"} 1.0',
            'inferflux_kv_usage_ratio{worker="0"} 0.25',
            'inferflux_kv_usage_ratio{worker="1"} 0.5',
        ]
    )
    assert read_load(text) == {
        "inferflux_scheduler_queue_depth": 3.0,
        "inferflux_running_sequences": 3.0,
        "inferflux_kv_usage_ratio": 0.5,
    }
