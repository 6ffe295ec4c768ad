"""A real Prometheus server scrapes a real InferFlux and answers PromQL about it.

Prometheus (the Debian package `make setup` installs) runs on a free loopback port with a
temporary config and TSDB, scrapes the `server_url` subprocess every second, and loads
deploy/prometheus/alerts.yml. The test drives real generations, then asks Prometheus'
HTTP API: is the target up, did generated tokens and TTFT samples arrive, do the alert
rules evaluate without error, and does every query of the Grafana dashboard run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.server_process import free_port

pytestmark = [pytest.mark.model, pytest.mark.server]

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "inferflux.json"
WAIT_S = 90.0


@pytest.fixture(scope="module")
def prometheus(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a Prometheus that scrapes `server_url` every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "prometheus is missing: `make setup` installs it (scripts/install_prometheus.sh)"
        )
    tmp = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "inferflux",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [server_url.removeprefix("http://")]}],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    log_path = tmp / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address={url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: _ready(url, process), f"Prometheus at {url} ready", log_path)
        yield url
    finally:
        _stop(process)


def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"prometheus exited with {process.returncode}")
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def wait_for(check: Callable[[], Any], what: str, log_path: Path | None = None) -> Any:
    """Poll `check` until it returns something truthy (bounded by WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.5)
    log = log_path.read_text(errors="replace")[-3000:] if log_path else ""
    raise TimeoutError(f"no {what} after {WAIT_S:g}s\n{log}")


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=10)
    body = response.json()
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


def scalar(prometheus: str, promql: str) -> float | None:
    result = query(prometheus, promql)
    return float(result[0]["value"][1]) if result else None


def test_prometheus_scrapes_inferflux_and_answers_promql(prometheus: str, server_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 5}
    for stream in (False, True):
        response = httpx.post(
            f"{server_url}/v1/chat/completions", json={**body, "stream": stream}, timeout=60
        )
        assert response.status_code == 200, response.text

    up = wait_for(lambda: scalar(prometheus, 'up{job="inferflux"}'), "scraped target")
    assert up == 1.0
    generated = wait_for(
        lambda: scalar(prometheus, 'sum(inferflux_generation_tokens_total{job="inferflux"}) > 0'),
        "generated tokens in Prometheus",
    )
    assert generated >= 2
    ttft = wait_for(
        lambda: scalar(
            prometheus,
            "histogram_quantile(0.5, sum by (le) (inferflux_time_to_first_token_seconds_bucket))",
        ),
        "a TTFT quantile",
    )
    assert 0 < ttft < 600
    queue = scalar(prometheus, "sum(inferflux_scheduler_queue_depth)")
    assert queue is not None and queue >= 0
    hit_rate = scalar(prometheus, "inferflux_prefix_hit_rate")
    assert hit_rate is not None and 0 <= hit_rate <= 1


def _evaluated_rules(prometheus: str) -> list[dict[str, Any]] | None:
    response = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()
    rules = [r for g in response["data"]["groups"] for r in g["rules"]]
    if not rules or any(r["lastEvaluation"].startswith("0001") for r in rules):
        return None  # not every rule evaluated yet
    return rules


def test_alert_rules_load_and_evaluate_without_error(prometheus: str) -> None:
    rules = wait_for(lambda: _evaluated_rules(prometheus), "evaluated alert rules")
    assert len(rules) == 7
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy
    firing = [r["name"] for r in rules if r["state"] == "firing"]
    assert "InferfluxNoWorkerUp" not in firing


def test_every_dashboard_query_runs(prometheus: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 10
    for expr in exprs:
        # Grafana's variables, as Grafana would fill them for a one-hour view
        query(prometheus, expr.replace("$__rate_interval", "1m").replace("$__range", "1h"))
