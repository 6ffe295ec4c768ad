"""How a worker's KV buffer and prefix-cache budget follow runtime.kv_cache_sizing and
runtime.swa_full (pure config arithmetic; the memory itself is measured in bench/)."""

from __future__ import annotations

from inferflux.config.loader import load_settings
from inferflux.engine.protocol import ModelInfo
from inferflux.engine.worker import _prefix_cache, worker_config

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
    config = worker_config(load_settings(env={}), INFO)
    assert config.context.n_cells is None and config.context.swa_full
    assert config.context.n_seq_max == 16 + 8
    cache = _prefix_cache(config)
    assert cache is not None and cache.max_tokens == int(0.8 * 8 * 1024)


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
