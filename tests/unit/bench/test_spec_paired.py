"""bench/spec_paired.py: the rotation and the per-round ratios (pure logic, no server)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
spec_paired = importlib.import_module("spec_paired")


def _row(config: str, round_: int, prompt: int, tokens: int, seconds: float) -> dict[str, object]:
    return {
        "model": "m",
        "workload": "edit",
        "config": config,
        "round": round_,
        "prompt": prompt,
        "tokens": tokens,
        "seconds": seconds,
        "drafted": 10 if config == "on" else 0,
        "accepted": 6 if config == "on" else 0,
    }


def _by_config(rows: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {s["config"]: s for s in spec_paired.summarize(rows, "off")}


def test_every_config_goes_first_equally_often() -> None:
    configs = ["a", "b", "c"]
    orders = [spec_paired.rotation(configs, turn) for turn in range(6)]
    assert all(sorted(order) == configs for order in orders)
    firsts = [order[0] for order in orders]
    assert {c: firsts.count(c) for c in configs} == {"a": 2, "b": 2, "c": 2}


def test_no_round_sends_a_prompt_an_earlier_round_sent() -> None:
    sent = {spec_paired.fresh("Say hi.", r, i) for r in range(3) for i in range(2)}
    assert len(sent) == 6
    assert all(text.endswith("Say hi.") for text in sent)
    # the tags differ where the user message begins: no cached prefix reaches past it
    assert len({text.split()[1] for text in sent}) == 6


def test_a_drift_between_rounds_leaves_the_paired_ratio_alone() -> None:
    # round 1 runs at half speed for every config: tok/s halves, the ratio does not
    by_config = _by_config(
        [
            _row(c, r, 0, 100, s)
            for c, r, s in [("off", 0, 4), ("on", 0, 2), ("off", 1, 8), ("on", 1, 4)]
        ]
    )
    assert by_config["on"]["ratios"] == [2.0, 2.0]
    assert by_config["off"]["ratios"] == [1.0, 1.0]
    assert by_config["on"]["tok_s"] == 33.333  # 200 tokens in 6 s over both rounds
    assert (by_config["on"]["accepted"], by_config["on"]["drafted"]) == (12, 20)


def test_tok_s_is_tokens_over_the_configs_own_request_time() -> None:
    rows = [
        _row("off", 0, 0, 90, 3.0),
        _row("off", 0, 1, 30, 1.0),
        _row("on", 0, 0, 90, 1.0),
        _row("on", 0, 1, 30, 1.0),
    ]
    by_config = _by_config(rows)
    assert by_config["off"]["tok_s"] == 30.0
    assert by_config["on"]["tok_s"] == 60.0
    assert by_config["on"]["ratios"] == [2.0]
    table = spec_paired.markdown(list(by_config.values()), "off")
    assert "| m | edit | 1 | on | 60.0 | 2.000 [2.000–2.000] | 12 / 20 | 120 |" in table


def test_a_level_sends_every_prompt_in_turns_of_that_many() -> None:
    assert spec_paired.batches(4, 1) == [[0], [1], [2], [3]]
    assert spec_paired.batches(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # fewer prompts than clients: cycled, and every prompt is sent
    assert spec_paired.batches(4, 8) == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert spec_paired.batches(5, 4) == [[0, 1, 2, 3], [4, 0, 1, 2]]


def test_levels_are_compared_only_with_the_reference_at_the_same_level() -> None:
    rows = [
        {**_row("off", 0, 0, 100, 4.0), "concurrency": 1},
        {**_row("on", 0, 0, 100, 2.0), "concurrency": 1},
        {**_row("off", 0, 0, 400, 4.0), "concurrency": 4},
        {**_row("on", 0, 0, 400, 5.0), "concurrency": 4},
    ]
    ratios = {
        (s["concurrency"], s["config"]): s["ratios"] for s in spec_paired.summarize(rows, "off")
    }
    assert ratios[(1, "on")] == [2.0]
    assert ratios[(4, "on")] == [0.8]


def test_the_reference_must_be_one_of_the_configs() -> None:
    with pytest.raises(SystemExit, match="--reference inferflux-off is not among"):
        spec_paired.main(["--configs", "inferflux-on", "--reference", "inferflux-off"])
