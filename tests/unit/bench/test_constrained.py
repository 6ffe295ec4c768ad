"""bench/constrained.py: decode-rate arithmetic, the report, and a run against a fake SSE server."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
constrained = importlib.import_module("constrained")


def test_decode_rate_counts_the_tokens_after_the_first():
    sample = constrained.Sample("x", ttft_s=0.1, last_s=0.5, output_tokens=5)
    assert sample.decode_tok_s == pytest.approx(10.0)
    assert constrained.Sample("x", ttft_s=0.1, last_s=0.1, output_tokens=1).decode_tok_s is None
    assert (
        constrained.Sample("x", ok=False, ttft_s=0.1, last_s=0.5, output_tokens=5).decode_tok_s
        is None
    )


def test_cases_are_a_seeded_sample_of_the_corpus():
    every = constrained.load_cases(0, seed=0)
    assert len(every) >= 110
    sample = constrained.load_cases(10, seed=3)
    assert sample == constrained.load_cases(10, seed=3)
    assert len(sample) == 10 and sample != constrained.load_cases(10, seed=4)
    assert all({"name", "prompt", "schema", "example"} <= set(case) for case in sample)


def test_only_the_constrained_mode_sends_a_response_format():
    case = constrained.load_cases(1, seed=0)[0]
    free = constrained.build_body(case, "free", 32)
    schema = constrained.build_body(case, "json_schema", 32)
    assert "response_format" not in free
    assert schema["response_format"]["json_schema"] == {
        "name": case["name"],
        "schema": case["schema"],
        "strict": True,
    }
    assert free["messages"] == schema["messages"] and schema["stream"] is True


def _fake_app() -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        if "response_format" in body:
            name = body["response_format"]["json_schema"]["name"]
            text = json.dumps(next(c for c in CASES if c["name"] == name)["example"])
            pieces, finish = [text[i : i + 4] for i in range(0, len(text), 4)], "stop"
        else:
            pieces, finish = ["word "] * body["max_tokens"], "length"

        async def events():
            for i, piece in enumerate(pieces):
                last = i == len(pieces) - 1
                choice = {"delta": {"content": piece}, "finish_reason": finish if last else None}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            usage = {"completion_tokens": len(pieces)}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


CASES = constrained.load_cases(6, seed=1)


@pytest.mark.parametrize("mode", constrained.MODES)
async def test_a_configuration_times_every_request(mode):
    transport = httpx.ASGITransport(app=_fake_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        config = constrained.Config("fake", 2, mode)
        await constrained.run_config(client, config, CASES, 12)
    report = config.report()
    assert report["num_requests"] == 6 and report["num_errors"] == 0
    assert report["decode_tok_s"]["count"] == 6
    assert report["aggregate_tok_s"] > 0 and report["ttft_s"]["p50"] is not None
    if mode == "json_schema":
        assert report["num_stopped"] == report["num_schema_valid"] == 6
    else:
        assert report["num_stopped"] == 0 and report["output_tokens"] == 6 * 12
    json.dumps(report)  # JSON-safe


def test_overhead_compares_decode_rates_per_model_and_level():
    def report(mode, rate, ttft):
        return {
            "model": "m", "concurrency": 8, "mode": mode, "num_requests": 4, "num_errors": 0,
            "num_stopped": 4, "num_schema_valid": 4, "aggregate_tok_s": 100.0,
            "decode_tok_s": {"mean": rate, "p50": rate}, "ttft_s": {"p50": ttft},
        }  # fmt: skip

    reports = [report("free", 40.0, 0.2), report("json_schema", 30.0, 0.3)]
    (row,) = constrained.overhead_rows(reports)
    assert row["decode_overhead_pct"] == pytest.approx(25.0)
    assert row["ttft_p50_ratio"] == pytest.approx(1.5)
    table = constrained.markdown(reports, [row], "note")
    assert "| m | 8 | 25.0 % | 1.50×" in table.replace("| 40.0 | 30.0 ", "")


async def test_fewer_cases_than_clients_are_repeated_so_every_client_works():
    transport = httpx.ASGITransport(app=_fake_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
        config = constrained.Config("fake", 8, "json_schema")
        await constrained.run_config(client, config, CASES[:3], 12)
    assert config.report()["num_requests"] == 9
