"""The KV tier settings: the spec's env names, the derived host budget, and persistence
refusing to start without a folder."""

from __future__ import annotations

import pytest

from inferflux.config.loader import load_settings
from inferflux.errors import ConfigError


def test_spec_env_names_set_the_tiers() -> None:
    settings = load_settings(
        env={
            "INFERFLUX_NVME_OFFLOAD_PATH": "/tmp/kv",
            "INFERFLUX_KV_CPU_PAGES": "256",
            "INFERFLUX_KV_EVICTION": "lru",
        }
    )
    runtime = settings.runtime
    assert runtime.nvme_offload.path == "/tmp/kv"
    assert runtime.paged_kv.cpu_pages == 256
    assert runtime.paged_kv.host_max_bytes == 256 * 1024 * 1024
    assert runtime.paged_kv.eviction == "lru"


def test_a_host_tier_is_on_by_default_and_zero_turns_it_off() -> None:
    assert load_settings(env={}).runtime.paged_kv.host_max_bytes == 512 * 1024 * 1024
    off = load_settings(env={"INFERFLUX_KV_CPU_PAGES": "0"}).runtime.paged_kv
    assert off.host_max_bytes == 0


def test_unknown_eviction_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="INFERFLUX_KV_EVICTION"):
        load_settings(env={"INFERFLUX_KV_EVICTION": "fifo"})


def test_persistence_without_a_folder_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="runtime.nvme_offload.path"):
        load_settings(env={"INFERFLUX_RUNTIME__KV_PERSISTENCE__ENABLED": "true"})


def test_token_sizing_needs_the_unified_kv_buffer() -> None:
    with pytest.raises(ConfigError, match="runtime.kv_unified"):
        load_settings(env={"INFERFLUX_RUNTIME__KV_CACHE_SIZING": "tokens"})
    settings = load_settings(
        env={"INFERFLUX_RUNTIME__KV_CACHE_SIZING": "tokens", "INFERFLUX_RUNTIME__KV_UNIFIED": "1"}
    )
    assert settings.runtime.kv_cache_sizing == "tokens"
