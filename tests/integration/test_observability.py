"""Observability over the real engine (in-process app, SmolLM2): engine histograms from
StepStats, TTFT and ITL, /debug/requests with real token traces, /server/stats
throughput; and the deploy assets: every metric the Grafana dashboard and the alert rules
use exists in the real exposition, and `promtool check rules` accepts the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.model]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "inferflux.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
METRIC_NAME = re.compile(r"\binferflux_[a-z0-9_]+\b")
CHAT = {
    "messages": [{"role": "user", "content": "Name three colors."}],
    "max_tokens": 6,
    "temperature": 0,
}


async def samples(client: httpx.AsyncClient) -> dict[tuple[str, tuple], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def total(snapshot: dict, name: str, **labels: str) -> float:
    """The sum of every series of `name` whose labels include `labels`."""
    return sum(
        v for (n, lbls), v in snapshot.items() if n == name and set(labels.items()) <= set(lbls)
    )


async def test_real_generations_fill_every_latency_histogram(api_client: httpx.AsyncClient) -> None:
    before = await samples(api_client)
    response = await api_client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
    stream = await api_client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert stream.status_code == 200
    after = await samples(api_client)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    route = {"route": "/v1/chat/completions", "status": "200"}
    assert grew("inferflux_request_latency_seconds_count", **route) == 2
    assert grew("inferflux_time_to_first_token_seconds_count") == 2
    assert grew("inferflux_inter_token_latency_seconds_count") >= 2
    assert grew("inferflux_queue_wait_seconds_count", priority="normal") == 2
    assert grew("inferflux_prefill_duration_seconds_count", priority="normal") == 2
    assert grew("inferflux_decode_duration_seconds_count", priority="normal") == 2
    assert grew("inferflux_batch_exec_seconds_count") >= 2
    assert grew("inferflux_batch_size_count") >= 2
    assert grew("inferflux_generation_tokens_total") >= 2
    assert grew("inferflux_prompt_tokens_total") > 0
    assert grew("inferflux_prefill_tokens_total") > 0
    assert grew("inferflux_stream_tokens_total") >= 1
    assert total(after, "inferflux_worker_up") == 1
    assert total(after, "inferflux_model_load_seconds") > 0
    assert total(after, "inferflux_backend_info", backend="llama.cpp", mode="in_process") == 1


async def test_debug_requests_show_a_real_token_trace(api_client: httpx.AsyncClient) -> None:
    response = await api_client.post(
        "/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 6, "temperature": 0}
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    recent = (await api_client.get("/debug/requests")).json()["recent"]
    newest = recent[0]
    assert newest["phase"] == "finished"
    assert newest["num_output_tokens"] == usage["completion_tokens"]
    assert newest["num_prompt_tokens"] == usage["prompt_tokens"]
    assert newest["queue_wait_s"] is not None and newest["time_to_first_token_s"] is not None
    detail = (await api_client.get(f"/debug/requests/{newest['request_id']}")).json()
    token_ids = [t for event in detail["trace"] for t in event["token_ids"]]
    assert len(token_ids) == usage["completion_tokens"]
    assert all(event["text"] is None for event in detail["trace"])  # redacted by default


async def test_an_unstreamed_answer_reaches_the_api_in_chunks(
    api_client: httpx.AsyncClient,
) -> None:
    # the same greedy request collected and streamed: the same text, but the worker sends
    # the collected one's tokens every 0.25 s (its first at once), the streamed one's as
    # each step makes them
    body = {
        "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    whole = await api_client.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    streamed = await api_client.post("/v1/chat/completions", json={**body, "stream": True})
    assert streamed.status_code == 200
    chunks = [
        json.loads(line[len("data: ") :])
        for line in streamed.text.splitlines()
        if line.startswith("data: {")
    ]
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
    assert "".join(pieces) == whole.json()["choices"][0]["message"]["content"]
    traces = []
    for request_id in (chunks[0]["id"], whole.json()["id"]):  # live or finished, by id
        detail = (await api_client.get(f"/debug/requests/{request_id}")).json()
        traces.append([event["token_ids"] for event in detail["trace"]])
    streamed_trace, collected_trace = traces
    assert sum(map(len, collected_trace)) == sum(map(len, streamed_trace)) == 48
    assert len(collected_trace[0]) == 1  # time to first token is not delayed
    assert len(collected_trace) * 2 < len(streamed_trace)


async def test_server_stats_report_throughput_and_the_prefix_cache(
    api_client: httpx.AsyncClient,
) -> None:
    assert (await api_client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    stats = (await api_client.get("/server/stats")).json()
    assert stats["throughput"]["1m"]["generation_tokens_per_s"] > 0
    assert stats["throughput"]["1m"]["prompt_tokens_per_s"] >= 0
    # the defaults keep a finished request's KV parked in its slot (no cache slots)
    assert stats["prefix_cache"]["parked"] >= 1 and stats["prefix_cache"]["parked_tokens"] > 0
    assert stats["kv_cells_total"] > 0
    (worker,) = stats["workers"]
    assert worker["ready"] is True and worker["load_s"] > 0


def referenced_metrics() -> set[str]:
    """Every inferflux_* name in the dashboard's PromQL and the alert rules."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return set(METRIC_NAME.findall("\n".join(exprs))) | set(METRIC_NAME.findall(ALERTS.read_text()))


async def test_dashboard_and_alerts_use_only_exported_metrics(
    api_client: httpx.AsyncClient,
) -> None:
    assert (await api_client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    bad = await api_client.post("/v1/chat/completions", json={"messages": "not a list"})
    assert bad.status_code == 400  # error series appear with the first error
    exported = {name for name, _ in await samples(api_client)}
    missing = sorted(referenced_metrics() - exported)
    assert not missing, f"the dashboard or alerts use metrics /metrics does not export: {missing}"


def test_dashboard_is_grafana_json_over_a_prometheus_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "InferFlux"
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("first token", "inter-token", "throughput", "queue", "kv", "error", "prefix"):
        assert topic in titles, topic
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["type"] == "prometheus"
            assert all(t["refId"] and t["expr"] for t in panel["targets"])


def test_promtool_accepts_the_alert_rules_and_their_unit_tests() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make setup` installs it (scripts/install_prometheus.sh)")
    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout
    tests = ALERTS.with_name("alerts_test.yml")  # input series → expected alerts
    result = subprocess.run(
        [promtool, "test", "rules", str(tests)], check=False, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
