"""How a worker's KV buffer and prefix-cache budget follow runtime.kv_cache_sizing and
runtime.swa_full (pure config arithmetic; the memory itself is measured in bench/)."""

from __future__ import annotations

from inferflux.config.loader import load_settings
from inferflux.engine.engine_build import _prefix_cache, worker_config
from inferflux.engine.protocol import ModelInfo

INFO = ModelInfo(
    model_id="smol",
    path="/models/smol.gguf",
    architecture="llama",
    n_ctx=1024,
    n_ctx_train=8192,
    n_vocab=49152,
    size_bytes=1000,
    created=1_700_000_000,
    has_chat_template=True,
)


def test_slot_sizing_gives_every_sequence_a_context() -> None:
    config = worker_config(
        load_settings(env={"INFERFLUX_SCHEDULER__PREFIX_CACHE__SLOTS": "8"}), INFO
    )
    assert config.context.n_cells is None and config.context.swa_full
    assert config.context.n_seq_max == 16 + 8
    cache = _prefix_cache(config)
    assert cache is not None and cache.max_tokens == int(0.8 * 8 * 1024)


def test_parked_slots_and_a_host_tier_leave_no_cache_slots_by_default() -> None:
    """The defaults park finished requests' KV in place and save what they displace in
    host RAM: nothing fills a cache slot, so none is reserved (8 full contexts of KV less).
    The index stays, for the parked slots and the lower tiers."""
    config = worker_config(load_settings(env={}), INFO)
    assert config.context.n_seq_max == 16 and config.cache_slots == 0
    cache = _prefix_cache(config)
    assert cache is not None and cache.slot_ids == [] and cache.max_tokens == 0
    for env in (
        {"INFERFLUX_SCHEDULER__PREFIX_CACHE__REUSE_IN_PLACE": "false"},
        {"INFERFLUX_RUNTIME__PAGED_KV__CPU_PAGES": "0"},
        {"INFERFLUX_RUNTIME__KV_UNIFIED": "true"},
    ):  # a finished request's KV goes into a cache slot: 8 of them
        assert worker_config(load_settings(env=env), INFO).context.n_seq_max == 16 + 8, env
    off = worker_config(
        load_settings(env={"INFERFLUX_SCHEDULER__PREFIX_CACHE__ENABLED": "0"}), INFO
    )
    assert off.context.n_seq_max == 16 and _prefix_cache(off) is None


def test_token_sizing_adds_only_the_cache_budget_to_the_running_contexts() -> None:
    env = {
        "INFERFLUX_RUNTIME__KV_UNIFIED": "true",
        "INFERFLUX_RUNTIME__KV_CACHE_SIZING": "tokens",
        "INFERFLUX_RUNTIME__SWA_FULL": "false",
        "INFERFLUX_SCHEDULER__PREFIX_CACHE__MAX_TOKENS": "3000",
    }
    config = worker_config(load_settings(env=env), INFO)
    assert config.context.n_cells == 16 * 1024 + 3000
    assert not config.context.swa_full
    cache = _prefix_cache(config)
    assert cache is not None and cache.max_tokens == 3000
    del env["INFERFLUX_SCHEDULER__PREFIX_CACHE__MAX_TOKENS"]
    default = worker_config(load_settings(env=env), INFO)
    assert default.context.n_cells == 17 * 1024  # the budget defaults to one context
