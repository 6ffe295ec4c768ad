"""GET /v1/models and /v1/models/{id}: the one served model, in OpenAI's shapes plus
InferFlux `meta`."""

from __future__ import annotations

from fastapi import APIRouter

from inferflux.api.deps import ModelInfoDep
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import ModelNotFound
from inferflux.security.principal import current_principal
from inferflux.security.rbac import authorize_model

router = APIRouter(tags=["openai"])


def model_card(info: ModelInfo) -> dict[str, object]:
    """OpenAI's model object for `info`, with llama.cpp facts under `meta`."""
    return {
        "id": info.model_id,
        "object": "model",
        "created": info.created,
        "owned_by": "inferflux",
        "meta": {
            "architecture": info.architecture,
            "n_ctx": info.n_ctx,
            "n_ctx_train": info.n_ctx_train,
            "n_vocab": info.n_vocab,
            "size_bytes": info.size_bytes,
        },
    }


@router.get("/v1/models")
async def list_models(info: ModelInfoDep) -> dict[str, object]:
    """The models this server serves (one, for now) that the caller may use."""
    visible = current_principal().may_use_model(info.model_id)
    return {"object": "list", "data": [model_card(info)] if visible else []}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, info: ModelInfoDep) -> dict[str, object]:
    """One model by id; 404 (OpenAI's `model_not_found`) for a model this server lacks."""
    if model_id != info.model_id:
        raise ModelNotFound(
            f"the model '{model_id}' does not exist on this server; it serves "
            f"'{info.model_id}' (GET /v1/models)",
            param="model",
        )
    authorize_model(model_id)
    return model_card(info)
