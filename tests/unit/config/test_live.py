"""`patch_settings`: which settings change at runtime, checked by the config schema."""

from __future__ import annotations

import pytest

from inferflux.config.live import LIVE_KEYS, patch_settings
from inferflux.config.settings import Settings
from inferflux.errors import InvalidRequest, RestartRequired

STARTED = Settings.model_validate({"scheduler": {"max_batch_tokens": 256}})


def _patch(change: dict, current: Settings = STARTED) -> tuple[Settings, tuple[str, ...]]:
    patched = patch_settings(current, change, batch_limit=STARTED.scheduler.max_batch_tokens)
    return patched.settings, patched.changed


def test_every_live_key_is_a_setting_and_changes_alone() -> None:
    values = {
        "scheduler.max_batch_tokens": 128,
        "scheduler.queue_timeout_s": 2.5,
        "scheduler.aging_s": 0.5,
        "scheduler.batch_window_ms": 3.0,
        "scheduler.itl_target_ms": 150.0,
        "scheduler.itl_target_ratio": 2.0,
        "scheduler.burst_stall_ms": 2500.0,
        "scheduler.memory_low_mb": 512,
        "scheduler.stream_interval": 4,
        "scheduler.embed_tokens_per_step": 16,
        "scheduler.high_watermark": 900,
        "scheduler.low_watermark": 10,
        "scheduler.routing": "round_robin",
        "scheduler.balance_abs_threshold": 8,
        "scheduler.balance_rel_threshold": 2.0,
        "scheduler.affinity_min_match_tokens": 64,
        "scheduler.fairness.enable_preemption": False,
        "scheduler.fairness.high_priority_threshold": "normal",
        "scheduler.fairness.max_timeslice_tokens": 32,
        "scheduler.disaggregated.ticket_wait_s": 0.5,
        "scheduler.disaggregated.channel_capacity": 16,
        "scheduler.disaggregated.min_prompt_tokens": 64,
        "observability.log_level": "debug",
        "observability.log_sample_rate": 0.25,
        "observability.tenant_logging": {"acme": {"log_level": "debug"}},
    }
    assert set(values) == LIVE_KEYS
    for key, value in values.items():
        change: dict = {}
        *parents, leaf = key.split(".")
        node = change
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        settings, changed = _patch(change)
        assert changed == (key,)
        current = settings.model_dump(mode="json", exclude_none=True)
        for part in key.split("."):
            current = current[part]
        assert current == value


def test_the_current_value_of_a_restart_only_key_is_no_change() -> None:
    settings, changed = _patch({"scheduler": {"max_num_seqs": 16}, "server": {"port": 8080}})
    assert changed == () and settings == STARTED


@pytest.mark.parametrize(
    ("change", "param", "hint"),
    [
        ({"scheduler": {"max_num_seqs": 4}}, "scheduler.max_num_seqs", "restart"),
        ({"server": {"port": 9000}}, "server.port", "restart"),
        ({"scheduler": {"prefix_cache": {"slots": 2}}}, "scheduler.prefix_cache.slots", "restart"),
        ({"scheduler": {"max_batch_tokens": 512}}, "scheduler.max_batch_tokens", "256"),
        ({"scheduler": {"mode": "disaggregated"}}, "scheduler.mode", "restart"),
        ({"scheduler": {"prefill_pool_size": 2}}, "scheduler.prefill_pool_size", "restart"),
        ({"scheduler": {"decode_pool_size": 3}}, "scheduler.decode_pool_size", "restart"),
        (
            {"scheduler": {"disaggregated": {"decode_cpus": [0]}}},
            "scheduler.disaggregated.decode_cpus",
            "restart",
        ),
        ({"guardrails": {"pii_action": "redact"}}, "guardrails.pii_action", "/v1/admin/guardrails"),
        ({"rate_limit": {"tiers": {"gold": {}}}}, "rate_limit.tiers", "/v1/admin/rate_limit"),
    ],
)
def test_a_key_that_needs_a_restart_is_refused_by_name(change, param, hint) -> None:
    with pytest.raises(RestartRequired) as caught:
        _patch(change)
    assert caught.value.param == param and hint in caught.value.message
    assert caught.value.http_status == 409


def test_a_live_key_beside_a_restart_only_key_changes_nothing() -> None:
    with pytest.raises(RestartRequired):
        _patch({"scheduler": {"stream_interval": 3, "max_num_seqs": 2}})


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"scheduler": {"nope": 1}}, "scheduler.nope"),
        ({"scheduler": {"stream_interval": 0}}, "scheduler.stream_interval"),
        ({"scheduler": {"low_watermark": 2000}}, "scheduler"),
        ({"observability": {"log_level": "loud"}}, "observability.log_level"),
        ({"observability": {"tenant_logging": {"bad name!": {}}}}, None),
        ({"scheduler": 3}, "scheduler"),
        ({"scheduler": {"mode": "split"}}, "scheduler.mode"),
        ({"scheduler": {"itl_target_ratio": 0.5}}, "scheduler.itl_target_ratio"),
        (
            {"scheduler": {"disaggregated": {"channel_capacity": 0}}},
            "scheduler.disaggregated.channel_capacity",
        ),
    ],
)
def test_what_the_schema_refuses_is_a_400(change, param) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _patch(change)
    if param is not None:
        assert caught.value.param == param


def test_tenant_logging_entries_merge_and_null_removes_one() -> None:
    first, _ = _patch({"observability": {"tenant_logging": {"a": {"log_level": "debug"}}}})
    second, changed = _patch(
        {"observability": {"tenant_logging": {"b": {"log_sample_rate": 0.5}}}}, first
    )
    assert set(second.observability.tenant_logging) == {"a", "b"}
    third, _ = _patch({"observability": {"tenant_logging": {"a": None}}}, second)
    assert set(third.observability.tenant_logging) == {"b"}
    assert changed == ("observability.tenant_logging",)
