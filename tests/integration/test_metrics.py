"""/metrics on the real server: OBS-1 names for the scheduler, fairness and prefix cache,
parsed with prometheus_client's own parser after real traffic."""

from __future__ import annotations

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
        "inferflux_fairness_resumes_total",
        "inferflux_scheduler_queue_depth",
        "inferflux_prefix_hit_rate",
        "inferflux_prefix_cached_tokens",
        "inferflux_kv_cells_total",
    ):
        assert (name, ()) in after, name
    assert 0 < after[("inferflux_prefix_hit_rate", ())] <= 1
    assert after[("inferflux_scheduler_queue_depth", ())] == 0
