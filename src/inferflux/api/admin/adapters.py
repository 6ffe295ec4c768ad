"""`/v1/admin/adapters`: LoRA adapters at runtime (list, load, swap, unload).

ADAPTER-MANAGER: the security layer attaches `require_scope(Scope.ADAPTER_MANAGER)` to this
router (issue #6). An adapter is a LoRA GGUF inside the models folder with its SHA-256
(and a signature when `registry.require_signatures` is on), bound to a base model; it is
served as the model `<base id>:<adapter id>` (requests name it so, or send `model` and
`adapter`), in engine workers of its own whose llama.cpp context applies it to every
sequence: a batch never mixes adapter sets. Loading, swapping and unloading follow the
model lifecycle (docs/models.md): verified before llama.cpp reads a byte, in-flight
requests finish on the adapter they started with.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferflux.api.admin.models import view_json
from inferflux.api.deps import json_body
from inferflux.api.errors import invalid_request_from
from inferflux.api.model_cards import find_view
from inferflux.api.openapi import error_doc
from inferflux.api.state import LifecycleDep, ModelsDep
from inferflux.config.manifest import AdapterEntry
from inferflux.errors import InvalidRequest, ModelNotFound
from inferflux.models.protocol import ModelView

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class AdminAdapterRequest(BaseModel):
    """`load` and `swap` take the adapter's fields; `unload` takes `id` and `base`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["load", "swap", "unload"]
    id: str = Field(min_length=1, max_length=128)
    base: str = Field(min_length=1, max_length=128)
    path: str | None = None
    sha256: str | None = None
    scale: float | None = None
    signature: str | None = None

    def entry(self) -> AdapterEntry:
        fields = self.model_dump(exclude={"action"}, exclude_unset=True)
        try:
            return AdapterEntry.model_validate(fields)
        except ValidationError as exc:
            raise invalid_request_from(exc.errors()) from None


AdminAdapterBody = Annotated[AdminAdapterRequest, Depends(json_body(AdminAdapterRequest))]


def adapter_json(view: ModelView) -> dict[str, object]:
    """One adapter model as this API shows it."""
    (adapter, *_) = view.adapters
    return {
        "id": adapter.adapter_id,
        "base": view.adapter_of,
        "model": view.model_id,
        "path": adapter.path,
        "sha256": adapter.sha256,
        "scale": adapter.scale,
        **{k: v for k, v in view_json(view).items() if k not in ("id", "path", "sha256")},
    }


@router.get("/adapters")
async def list_adapters(models: ModelsDep) -> dict[str, object]:
    """Every LoRA adapter model: loaded, registered, retiring or failed."""
    views = [view for view in models.models() if view.adapter_of is not None]
    return {"object": "list", "data": [adapter_json(view) for view in views]}


@router.post(
    "/adapters",
    responses={
        409: error_doc("The adapter is loaded already (use swap)"),
        422: error_doc("The file does not verify (SHA-256, signature, path, adapter header)"),
    },
)
async def manage_adapter(
    models: ModelsDep, lifecycle: LifecycleDep, body: AdminAdapterBody
) -> dict[str, object]:
    """Load, swap or unload an adapter; answers once the change is made."""
    if body.action == "unload":
        extra = sorted(body.model_fields_set - {"action", "id", "base"})
        if extra:
            raise InvalidRequest(f"action unload takes only `id` and `base`, not {extra[0]}")
        base = find_view(models.models(), body.base)
        if base is None:
            raise ModelNotFound(f"model '{body.base}' not found", param="base")
        task = lifecycle.unload(f"{base.model_id}:{body.id}", forget=True)
    else:
        if body.path is None:
            raise InvalidRequest(f"action {body.action} needs `path` and `sha256`", param="path")
        task = lifecycle.load_adapter(body.entry(), replace=body.action == "swap")
    # NOTE: shielded: an admin client that gives up does not undo a half-done swap.
    result = await asyncio.shield(task)
    views = [view for view in models.models() if view.adapter_of is not None]
    return {
        "action": result.action,
        "model": result.model_id,
        "load_s": None if result.load_s is None else round(result.load_s, 3),
        "retiring": result.retiring,
        "adapters": [adapter_json(view) for view in views],
    }
