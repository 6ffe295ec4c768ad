"""How models are described: the GGUF facts every listing shows, and OpenAI model cards.

Owns: `model_facts` (architecture, parameter count, quantization, context length, chat
template, MoE experts, `capabilities`: `vision` for a model with an mmproj) from a loaded
model's `ModelInfo` or from the GGUF header of a registered file that is not loaded
(`registered_metadata`: parsed once per file version, off the event loop, never by
llama.cpp), and `model_card`, OpenAI's model object with those facts under `meta` and, as
llama-server's router and OpenRouter do, `architecture` (`input_modalities` ["text",
"image"] for a vision model, `output_modalities` ["text"]). Does not own: the routes
(openai/models.py, ollama/models.py).
"""

from __future__ import annotations

import contextlib
import functools
import os

import anyio

from inferflux.engine.gguf_metadata import GgufMetadata, read_gguf_metadata
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import ModelLoadError
from inferflux.models.protocol import ModelView
from inferflux.security.principal import Principal

_DEFAULT_CTX = 4096  # model_files.DEFAULT_MAX_CTX: the context when none is configured


def human_number(count: int) -> str:
    """Ollama's `parameter_size` (format.HumanNumber): 134.52M, 3.2B, 7B, 512K."""
    if count >= 1_000_000_000:
        number = count / 1_000_000_000
        return f"{int(number)}B" if number.is_integer() else f"{number:.1f}B"
    if count >= 1_000_000:
        number = count / 1_000_000
        return f"{int(number)}M" if number.is_integer() else f"{number:.2f}M"
    if count >= 1_000:
        return f"{count / 1_000:.0f}K"
    return str(count)


def capabilities(vision: bool) -> list[str]:
    """What a model does, as Ollama's `/api/show` and our `meta.capabilities` say it:
    `completion`, plus `vision` when it takes images (it has an mmproj)."""
    return ["completion", "vision"] if vision else ["completion"]


def input_modalities(vision: bool) -> dict[str, list[str]]:
    """OpenRouter's and llama-server's `architecture` of a model object: what goes in and
    out (`image` in when the model has an mmproj)."""
    return {
        "input_modalities": ["text", "image"] if vision else ["text"],
        "output_modalities": ["text"],
    }


def model_facts(info: ModelInfo) -> dict[str, object]:
    """The GGUF facts of a loaded model."""
    return {
        "parameters": info.num_parameters,
        "parameter_size": human_number(info.num_parameters),
        "quantization": info.quantization,
        "context_length": info.n_ctx_train,
        "has_chat_template": info.has_chat_template,
        "is_moe": info.is_moe,
        "n_experts": info.n_experts,
        "n_active_experts": info.n_active_experts,
        "capabilities": capabilities(info.vision),
    }


def metadata_facts(meta: GgufMetadata) -> dict[str, object]:
    """The same facts from a GGUF header (a registered model that is not loaded)."""
    return {
        "architecture": meta.architecture,
        "parameters": meta.num_parameters,
        "parameter_size": human_number(meta.num_parameters),
        "quantization": meta.quantization_name,
        "context_length": meta.arch_int("context_length"),
        "has_chat_template": meta.has_chat_template,
        "is_moe": meta.n_experts > 0,
        "n_experts": meta.n_experts,
        "n_active_experts": meta.n_active_experts,
    }


@functools.lru_cache(maxsize=64)
def _metadata(path: str, size_bytes: int, mtime_ns: int) -> GgufMetadata:
    return read_gguf_metadata(path)  # size and mtime: a replaced file is read again


async def registered_metadata(path: str) -> GgufMetadata | None:
    """The GGUF header of a registered file (None when it is missing or not a GGUF)."""
    try:
        stat = os.stat(path)
        return await anyio.to_thread.run_sync(_metadata, path, stat.st_size, stat.st_mtime_ns)
    except (OSError, ModelLoadError):
        return None


def model_card(info: ModelInfo, view: ModelView | None = None) -> dict[str, object]:
    """OpenAI's model object for a loaded model, with llama.cpp facts under `meta`."""
    meta: dict[str, object] = {
        "architecture": info.architecture,
        "n_ctx": info.n_ctx,
        "n_ctx_train": info.n_ctx_train,
        "n_vocab": info.n_vocab,
        "size_bytes": info.size_bytes,
        **model_facts(info),
        "aliases": list(info.aliases),
        "loaded": True,
    }
    if view is not None:
        meta["default"] = view.is_default
    return {
        "id": info.model_id,
        "object": "model",
        "created": info.created,
        "owned_by": "inferflux",
        "architecture": input_modalities(info.vision),
        "meta": meta,
    }


async def registered_card(view: ModelView) -> dict[str, object]:
    """The model object of a registered model that is not loaded (facts from its header)."""
    if view.info is not None:
        return model_card(view.info, view)
    meta_data = await registered_metadata(view.path)
    created = 0
    with contextlib.suppress(OSError):
        created = int(os.stat(view.path).st_mtime)
    meta: dict[str, object] = metadata_facts(meta_data) if meta_data is not None else {}
    meta.update(aliases=list(view.aliases), loaded=False, default=view.is_default,
                capabilities=capabilities(view.vision))  # fmt: skip
    return {"id": view.model_id, "object": "model", "created": created,
            "owned_by": "inferflux", "architecture": input_modalities(view.vision),
            "meta": meta}  # fmt: skip


def find_view(views: list[ModelView], name: str) -> ModelView | None:
    """The listed model `name` names: an id or alias, also with Ollama's `:latest`."""
    for candidate in (name, name.removesuffix(":latest")):
        for view in views:
            if view.listed() and (candidate == view.model_id or candidate in view.aliases):
                return view
    return None


def provisional_info(view: ModelView, meta: GgufMetadata) -> ModelInfo:
    """What a registered model that is not loaded will look like (header facts; the
    context is the default, min(training context, 4096), until it loads)."""
    n_ctx_train = meta.arch_int("context_length")
    try:
        stat = os.stat(view.path)
        size_bytes, created = stat.st_size, int(stat.st_mtime)
    except OSError:
        size_bytes, created = 0, 0
    return ModelInfo(
        model_id=view.model_id,
        path=view.path,
        architecture=meta.architecture,
        n_ctx=min(n_ctx_train or _DEFAULT_CTX, _DEFAULT_CTX),
        n_ctx_train=n_ctx_train,
        n_vocab=0,
        size_bytes=size_bytes,
        created=created,
        has_chat_template=meta.has_chat_template,
        aliases=view.aliases,
        num_parameters=meta.num_parameters,
        quantization=meta.quantization_name,
        n_experts=meta.n_experts,
        n_active_experts=meta.n_active_experts,
        mmproj=view.mmproj,
    )


def may_see(view: ModelView, principal: Principal) -> bool:
    """Whether `principal`'s `allowed_models` covers the model (its id, or a LoRA adapter
    model's base id)."""
    names = (view.model_id, view.adapter_of) if view.adapter_of else (view.model_id,)
    return any(principal.may_use_model(name) for name in names)
