"""/metrics on the real server: OBS-1 names for the scheduler, fairness and prefix cache,
parsed with prometheus_client's own parser after real traffic."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.model, pytest.mark.server]

SYSTEM = (
    "You are a meticulous assistant for a museum. You answer visitors' questions about "
    "paintings, sculptures and the history of art in two short sentences."
)


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_prefix_and_fairness_metrics_follow_real_requests(server_url: str) -> None:
    before = samples(server_url)
    for question in ("Who painted the Mona Lisa?", "Who sculpted David?"):
        body = {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ],
            "max_tokens": 4,
            "temperature": 0,
        }
        response = httpx.post(f"{server_url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
    after = samples(server_url)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert delta("inferflux_prefix_hits_total") >= 1
    assert delta("inferflux_prefix_matched_tokens_total") >= 20  # the shared system prompt
    assert delta("inferflux_fairness_tokens_total", priority="normal") >= 2
    for name in (
        "inferflux_prefix_misses_total",
        "inferflux_prefix_partial_hits_total",
        "inferflux_prefix_evictions_total",
        "inferflux_fairness_preemptions_total",
        "inferflux_fairness_yields_total",
        "inferflux_fairness_interrupts_total",
        "inferflux_fairness_resumes_total",
        "inferflux_scheduler_queue_depth",
        "inferflux_prefix_hit_rate",
        "inferflux_prefix_cached_tokens",
        "inferflux_prefix_parked_tokens",
        "inferflux_kv_cells_total",
    ):
        assert (name, ()) in after, name
    assert 0 < after[("inferflux_prefix_hit_rate", ())] <= 1
    assert after[("inferflux_scheduler_queue_depth", ())] == 0


def test_a_high_priority_arrival_stops_a_long_low_priority_step(server_url: str) -> None:
    """Through the real worker loop: a low-priority request whose 1,500-token prompt takes
    several 512-token steps, and a high-priority request sent while they run. The worker
    reads the high one from inside llama.cpp's abort callback and stops the step
    (inferflux_fairness_interrupts_total goes up); both answers come back whole. A step
    too far along is not stopped, so this tries up to three times."""
    name = ("inferflux_fairness_interrupts_total", ())

    def post(body: dict[str, object]) -> httpx.Response:
        return httpx.post(f"{server_url}/v1/completions", json=body, timeout=300)

    for attempt in range(3):
        before = samples(server_url)[name]
        low = {  # a new prompt each try: a cached one would skip the long steps
            "prompt": f"Draft {attempt}. " + "The river runs past the mill to the sea. " * 150,
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
            "priority": "low",
        }
        high = {"prompt": "Say hi.", "max_tokens": 4, "temperature": 0, "priority": "high"}
        with ThreadPoolExecutor(2) as pool:
            low_answer = pool.submit(post, low)
            time.sleep(0.3)  # the low prompt's steps are running
            high_answer = pool.submit(post, high)
            answers = (low_answer.result(), high_answer.result())
        for answer in answers:
            assert answer.status_code == 200, answer.text
        assert answers[0].json()["usage"]["completion_tokens"] == 4
        assert answers[0].json()["usage"]["prompt_tokens"] > 1_000
        assert answers[1].json()["usage"]["completion_tokens"] >= 1
        if samples(server_url)[name] > before:
            return
    pytest.fail("no step was stopped for the high-priority request in three tries")
