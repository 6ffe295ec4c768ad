"""LM Studio's model routes: `GET /api/v0/models` and `GET /api/v0/models/{id}` (read scope).

Every registered model the caller may use (`allowed_models`), as LM Studio describes one:
`id`, `object` "model", `type` (`embeddings` for encoder-only architectures, `vlm` for a
model with an mmproj, else `llm`), `publisher` (the GGUF's `general.organization`, else
"local"), `arch`, `compatibility_type` "gguf", `quantization`, `state` (`loaded` or
`not-loaded`) and `max_context_length` (the context the model was trained for). A model
that is not loaded is described from its file's header, without loading it.
"""

from __future__ import annotations

from fastapi import APIRouter

from inferflux.api.model_cards import may_see, registered_metadata
from inferflux.api.state import ContextDep, ModelsDep
from inferflux.engine.gguf_metadata import GgufMetadata
from inferflux.errors import ModelNotFound
from inferflux.models.protocol import ModelView
from inferflux.security.rbac import authorize_model

router = APIRouter(prefix="/api/v0", tags=["lmstudio"])

# llama.cpp architectures that embed and cannot generate
_EMBEDDING_ARCHITECTURES = frozenset({"bert", "nomic-bert", "jina-bert-v2", "t5encoder"})


def lmstudio_model(view: ModelView, meta: GgufMetadata | None) -> dict[str, object]:
    """One model in LM Studio's shape (facts from the loaded model, else its header)."""
    info = view.info
    arch = info.architecture if info is not None else (meta.architecture if meta else "")
    quant = info.quantization if info is not None else (meta.quantization_name if meta else "")
    context = info.n_ctx_train if info is not None else None
    if context is None and meta is not None:
        context = meta.arch_int("context_length")
    publisher = meta.values.get("general.organization") if meta is not None else None
    return {
        "id": view.model_id,
        "object": "model",
        "type": _model_type(arch, view.vision),
        "publisher": publisher if isinstance(publisher, str) and publisher else "local",
        "arch": arch,
        "compatibility_type": "gguf",
        "quantization": quant,
        "state": "loaded" if view.state == "loaded" else "not-loaded",
        "max_context_length": context,
    }


def _model_type(arch: str, vision: bool) -> str:
    if arch in _EMBEDDING_ARCHITECTURES:
        return "embeddings"
    return "vlm" if vision else "llm"


async def _described(view: ModelView) -> dict[str, object]:
    return lmstudio_model(view, await registered_metadata(view.path))


@router.get("/models")
async def list_models(models: ModelsDep, context: ContextDep) -> dict[str, object]:
    """Every registered model the caller may use, loaded or not."""
    caller = context.caller
    views = [view for view in models.models() if view.listed() and may_see(view, caller)]
    return {"object": "list", "data": [await _described(view) for view in views]}


@router.get("/models/{model_id:path}")
async def retrieve_model(
    model_id: str, models: ModelsDep, context: ContextDep
) -> dict[str, object]:
    """One model by id or alias; 404 `model_not_found` (OpenAI's envelope) for one this
    server lacks, 403 for one outside the caller's `allowed_models`."""
    for view in models.models():
        if view.listed() and (model_id == view.model_id or model_id in view.aliases):
            names = (view.model_id, view.adapter_of) if view.adapter_of else (view.model_id,)
            authorize_model(context.caller, *names)
            return await _described(view)
    raise ModelNotFound(
        f"the model '{model_id}' does not exist on this server (GET /api/v0/models lists "
        "the models)",
        param="model",
    )
