"""Speculative decoding through the real server (on by default): the per-request opt-out,
the drafted/accepted report in `usage`, /metrics and /server/stats."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.server_process import serving
from tests.integration.test_metrics import samples

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def spec_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of its own. NOTE: the goodput gate learns each match length's acceptance
    per worker (`MatchPrior`); on the session's shared server, what the earlier tests'
    traffic taught it decided whether this module's copy request drafted at all (CI: 0
    drafts once, with row costs measured at 1.12 / 0.50). The row costs are pinned to
    the ones measured on an idle 2-core machine: measured on a busy one (1.25 / 0.55)
    they make the gate decline this short copy, which is right, but not this test's
    subject (test_speculative_engine.py covers the measurement)."""
    log = tmp_path_factory.mktemp("speculative") / "server.log"
    env = {
        "INFERFLUX_RUNTIME__SPECULATIVE_DECODING__SECOND_ROW_COST": "1.0",
        "INFERFLUX_RUNTIME__SPECULATIVE_DECODING__EXTRA_ROW_COST": "0.45",
    }
    with serving(env, log) as url:
        yield url


DOCUMENT = (
    "Opening hours of the Bergen harbour office. Monday to Friday the office opens at "
    "seven in the morning and closes at five in the afternoon. On Saturdays it opens at "
    "nine and closes at one. On Sundays and public holidays it stays closed. Tickets for "
    "the island boats are sold at the office and on board; children under twelve travel "
    "free when they travel with an adult."
)


def ask(url: str, **extra: object) -> dict:
    body = {
        "messages": [
            {"role": "user", "content": f"{DOCUMENT}\n\nRepeat the text above word for word."}
        ],
        "max_tokens": 48,
        "temperature": 0,
        **extra,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_copying_speculates_and_opting_out_gives_the_same_answer(spec_url: str) -> None:
    # NOTE: the first ask fills the prefix cache, so both compared asks start alike (a
    # cache hit computes the prompt's last token alone: other logits than a whole prefill)
    ask(spec_url, speculative=False)
    before = samples(spec_url)
    on = ask(spec_url)
    details = on["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0
    assert details["rejected_prediction_tokens"] >= 0
    off = ask(spec_url, speculative=False)
    off_details = off["usage"]["completion_tokens_details"]
    assert off_details["accepted_prediction_tokens"] == 0
    assert off_details["rejected_prediction_tokens"] == 0
    assert on["choices"][0]["message"]["content"] == off["choices"][0]["message"]["content"]
    assert on["usage"]["completion_tokens"] == off["usage"]["completion_tokens"]

    after = samples(spec_url)

    def grew(name: str) -> float:
        return after[(name, ())] - before.get((name, ()), 0.0)

    assert grew("inferflux_spec_chunks_total") >= 1
    assert grew("inferflux_spec_tokens_reused_total") == details["accepted_prediction_tokens"]
    assert ("inferflux_spec_chunks_accepted_total", ()) in after
    assert 0.0 < after[("inferflux_spec_acceptance_rate", ())] <= 1.0
    assert after[("inferflux_spec_tokens_per_verification", ())] > 1.0

    stats = httpx.get(f"{spec_url}/server/stats", timeout=10).json()
    spec = stats["speculative"]
    assert spec["chunks"] >= 1 and spec["accepted_tokens"] >= details["accepted_prediction_tokens"]
    learned = spec["by_match_length"]  # what the goodput gate learned from those drafts
    assert sum(bucket["positions"] for bucket in learned) >= spec["accepted_tokens"]
    assert stats["models"][0]["speculative"] == spec


def test_n_choices_each_speculate(spec_url: str) -> None:
    answer = ask(spec_url, n=2, seed=5)
    assert len(answer["choices"]) == 2
    assert answer["choices"][0]["message"]["content"] == answer["choices"][1]["message"]["content"]
    assert answer["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_a_bad_opt_out_value_is_a_400(spec_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "speculative": "sometimes"}
    response = httpx.post(f"{spec_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert "speculative" in response.text


def test_the_native_route_reports_drafts_in_timings(spec_url: str) -> None:
    body = {
        "prompt": f"{DOCUMENT}\n\nThe same text again: {DOCUMENT[:60]}",
        "max_tokens": 32,
        "temperature": 0,
    }
    response = httpx.post(f"{spec_url}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    timings = response.json()["timings"]
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0
