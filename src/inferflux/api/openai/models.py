"""GET /v1/models and /v1/models/{id}: the registered models the caller may use, in OpenAI's
shapes plus InferFlux `meta` (GGUF facts, aliases, whether the model is loaded and the
default)."""

from __future__ import annotations

from fastapi import APIRouter

from inferflux.api.model_cards import may_see, model_card, registered_card
from inferflux.api.state import ContextDep, ModelsDep
from inferflux.errors import ModelNotFound
from inferflux.security.rbac import authorize_model

router = APIRouter(tags=["openai"])

__all__ = ["model_card", "router"]


@router.get("/v1/models")
async def list_models(models: ModelsDep, context: ContextDep) -> dict[str, object]:
    """Every registered model the caller may use (`allowed_models`), the default first;
    loaded ones with their full facts."""
    caller = context.caller
    views = [view for view in models.models() if view.listed() and may_see(view, caller)]
    return {"object": "list", "data": [await registered_card(view) for view in views]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(
    model_id: str, models: ModelsDep, context: ContextDep
) -> dict[str, object]:
    """One model by id or alias; 404 (OpenAI's `model_not_found`) for one this server
    lacks, 403 for one outside the caller's `allowed_models`."""
    for view in models.models():
        if view.listed() and (model_id == view.model_id or model_id in view.aliases):
            names = (view.model_id, view.adapter_of) if view.adapter_of else (view.model_id,)
            authorize_model(context.caller, *names)
            return await registered_card(view)
    raise ModelNotFound(
        f"the model '{model_id}' does not exist on this server (GET /v1/models lists the models)",
        param="model",
    )
