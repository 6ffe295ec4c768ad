"""bench/workload.py (prompts, percentiles) and bench/serve_load.py against a fake SSE server."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

BENCH = Path(__file__).resolve().parents[3] / "bench"


def _import_bench(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


workload = _import_bench("workload")
serve_load = _import_bench("serve_load")


# --- workload -----------------------------------------------------------------------------


def test_prompts_are_deterministic_and_vary_with_seed():
    first = workload.make_prompts(20, seed=7, min_words=8, max_words=64)
    assert first == workload.make_prompts(20, seed=7, min_words=8, max_words=64)
    assert first != workload.make_prompts(20, seed=8, min_words=8, max_words=64)
    assert len(set(first)) == 20


@pytest.mark.parametrize(("low", "high"), [(1, 1), (3, 5), (8, 64), (200, 300)])
def test_prompt_word_counts_stay_in_range(low, high):
    for prompt in workload.make_prompts(50, seed=1, min_words=low, max_words=high):
        assert low <= len(prompt.split()) <= high
        assert prompt[-1] in ".?!"


@pytest.mark.parametrize(("n", "low", "high"), [(-1, 1, 2), (1, 0, 2), (1, 5, 4)])
def test_make_prompts_rejects_bad_arguments(n, low, high):
    with pytest.raises(ValueError):
        workload.make_prompts(n, seed=0, min_words=low, max_words=high)


def test_percentile_matches_numpy_linear():
    values = [0.3, 1.0, 0.01, 7.5, 2.2, 2.2, 0.9]
    for q in (0, 1, 50, 90, 99, 100):
        assert workload.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_summarize():
    summary = workload.summarize([4.0, 1.0, 3.0, 2.0])
    assert (summary.count, summary.mean, summary.min, summary.max) == (4, 2.5, 1.0, 4.0)
    assert summary.p50 == pytest.approx(2.5)
    empty = workload.summarize([])
    assert empty.count == 0
    assert empty.p99 is None
    assert json.dumps(empty.as_dict())  # JSON-safe: no NaN


# --- serve_load against a fake server ------------------------------------------------------


def _fake_app(mode: str = "ok") -> Starlette:
    seen: list[dict] = []

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model"}]})

    async def generate(request: Request) -> Response:
        body = await request.json()
        seen.append(body)
        if mode == "busy":
            return JSONResponse({"error": {"message": "busy"}}, status_code=503)
        chat = request.url.path.endswith("chat/completions")

        async def events():
            for i in range(body["max_tokens"]):
                if mode == "error_event" and i == 2:
                    yield 'data: {"error": {"message": "worker died"}}\n\n'
                    return
                last = i == body["max_tokens"] - 1
                choice = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
                choice["finish_reason"] = "length" if last else None
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": 5, "completion_tokens": body["max_tokens"]}
            if mode != "no_usage":
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
        ]
    )
    app.state.seen = seen
    return app


def _config(endpoint: str = "chat", max_tokens: int = 6):
    return serve_load.LoadConfig(
        url="http://fake",
        model="fake-model",
        endpoint=endpoint,
        max_tokens=max_tokens,
        requests_per_client=3,
        seed=0,
        min_words=4,
        max_words=12,
    )


def _client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_level_report_counts_tokens_and_latencies(endpoint):
    app = _fake_app()
    async with _client(app) as client:
        report = await serve_load.run_level(client, _config(endpoint), concurrency=2)
    assert report["num_requests"] == 6
    assert report["num_errors"] == 0
    assert report["num_short"] == 0
    assert report["num_without_usage"] == 0
    assert report["output_tokens"] == 36
    assert report["output_tok_s"] > 0
    assert report["ttft_s"]["count"] == 6
    assert report["itl_s"]["count"] == 6 * 5  # 6 content chunks → 5 gaps per request
    assert report["request_tok_s"]["count"] == 6
    json.dumps(report)
    body = app.state.seen[0]
    assert body["ignore_eos"] is True
    assert body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True}
    assert ("messages" in body) is (endpoint == "chat")
    assert ("prompt" in body) is (endpoint == "completions")


async def test_missing_usage_falls_back_to_counting_chunks():
    async with _client(_fake_app("no_usage")) as client:
        report = await serve_load.run_level(client, _config(), concurrency=1)
    assert report["num_without_usage"] == 3
    assert report["output_tokens"] == 18


@pytest.mark.parametrize(("mode", "needle"), [("busy", "HTTP 503"), ("error_event", "worker")])
async def test_failures_are_counted_not_raised(mode, needle):
    async with _client(_fake_app(mode)) as client:
        report = await serve_load.run_level(client, _config(), concurrency=2)
    assert report["num_errors"] == 6
    assert report["output_tokens"] == 0
    assert needle in report["errors"][0]


async def test_resolve_model_takes_the_first_listed():
    async with _client(_fake_app()) as client:
        assert await serve_load.resolve_model(client) == "fake-model"


def test_table_and_level_parsing():
    assert serve_load.parse_levels("1,4, 8") == [1, 4, 8]
    result = serve_load.RequestResult(ttft_s=0.01, e2e_s=1.0, itl_s=[0.02], output_tokens=6)
    report = serve_load.level_report(1, [result], 1.0, _config())
    table = serve_load.format_table([report])
    assert "out tok/s" in table.splitlines()[0]
    assert "10.0" in table.splitlines()[1]  # TTFT p50 in ms


async def test_servers_without_ignore_eos_get_extra_fields_instead():
    app = _fake_app()
    config = dataclasses.replace(
        _config(), ignore_eos=False, extra_body={"logit_bias": {"2": -100}}
    )
    async with _client(app) as client:
        result = await serve_load.stream_one(client, config, "hi")
    body = app.state.seen[0]
    assert "ignore_eos" not in body
    assert body["logit_bias"] == {"2": -100}
    assert result.ok and result.output_tokens == 6


async def test_a_history_prompt_is_sent_as_messages_and_the_answer_kept():
    app = _fake_app()
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    async with _client(app) as client:
        result = await serve_load.stream_one(client, _config(max_tokens=3), history)
    assert app.state.seen[0]["messages"] == history
    assert result.text == "t0 t1 t2 "
    assert result.prompt_tokens == 5
    report = serve_load.level_report(1, [result], 1.0, _config(max_tokens=3))
    assert "text" not in report["requests"][0]
