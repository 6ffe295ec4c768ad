"""`scheduler.mode`, the pool sizes and `scheduler.disaggregated`: bounds, the CPU lists
from the environment, and what the schema refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferflux.config.loader import load_settings
from inferflux.config.settings import Settings
from inferflux.errors import ConfigError


def test_unified_is_the_default_mode() -> None:
    scheduler = Settings().scheduler
    assert scheduler.mode == "unified"
    assert (scheduler.prefill_pool_size, scheduler.decode_pool_size) == (1, 1)
    assert scheduler.disaggregated.prefill_cpus == []


def test_the_environment_sets_the_mode_the_pools_and_the_cpu_lists() -> None:
    settings = load_settings(
        env={
            "INFERFLUX_SCHEDULER__MODE": "disaggregated",
            "INFERFLUX_SCHEDULER__PREFILL_POOL_SIZE": "1",
            "INFERFLUX_SCHEDULER__DECODE_POOL_SIZE": "2",
            "INFERFLUX_SCHEDULER__DISAGGREGATED__PREFILL_CPUS": "0,1",
            "INFERFLUX_SCHEDULER__DISAGGREGATED__DECODE_CPUS": "[3, 2, 2]",
            "INFERFLUX_SCHEDULER__DISAGGREGATED__TICKET_WAIT_S": "0.25",
        }
    )
    scheduler = settings.scheduler
    assert scheduler.mode == "disaggregated"
    assert (scheduler.prefill_pool_size, scheduler.decode_pool_size) == (1, 2)
    assert scheduler.disaggregated.prefill_cpus == [0, 1]
    assert scheduler.disaggregated.decode_cpus == [2, 3]  # sorted, once each
    assert scheduler.disaggregated.ticket_wait_s == 0.25


@pytest.mark.parametrize(
    ("scheduler", "where"),
    [
        ({"mode": "split"}, "mode"),
        ({"mode": "Disaggregated"}, "mode"),
        ({"prefill_pool_size": 0}, "prefill_pool_size"),
        ({"decode_pool_size": 65}, "decode_pool_size"),
        ({"disaggregated": {"prefill_cpus": [0, -1]}}, "prefill_cpus"),
        ({"disaggregated": {"decode_cpus": "0,-2"}}, "decode_cpus"),
        ({"disaggregated": {"channel_capacity": 0}}, "channel_capacity"),
        ({"disaggregated": {"ticket_wait_s": -1}}, "ticket_wait_s"),
        ({"disaggregated": {"min_prompt_tokens": 1}}, "min_prompt_tokens"),
        ({"disaggregated": {"prefill_threads": 0}}, "prefill_threads"),
        ({"disaggregated": {"channel_max_mb": 0}}, "channel_max_mb"),
        ({"disaggregated": {"pool": 2}}, "pool"),
    ],
)
def test_the_schema_refuses(scheduler: dict, where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings.model_validate({"scheduler": scheduler})
    locs = [".".join(str(p) for p in e["loc"]) for e in caught.value.errors()]
    assert any(where in loc for loc in locs), locs


def test_a_negative_cpu_from_the_environment_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="PREFILL_CPUS.*CPU ids are 0 or more"):
        load_settings(env={"INFERFLUX_SCHEDULER__DISAGGREGATED__PREFILL_CPUS": "0,-1"})
