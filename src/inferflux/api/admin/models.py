"""`/v1/admin/models`: list the models and drive their lifecycle (load, unload, swap, default).

ADMIN-ONLY: the security layer attaches `require_scope(Scope.ADMIN)` to this router
(issue #6). A load or swap names a GGUF inside the models folder with its SHA-256 (and a
signature when `registry.require_signatures` is on), exactly like a manifest entry; the
file is verified before llama.cpp reads it. The request returns once the new model
serves (seconds); the model it replaced finishes its in-flight requests in the
background (GET shows it as `retiring` until its workers are gone).

Errors: 400 a malformed body, 404 an unknown id, 409 a conflicting state (unloading the
default, loading an id that exists), 422 a file or signature that does not verify, 500
a file llama.cpp refuses, 503 no room (every resident model busy) or, with `redis.url`,
model replication unavailable (api/model_sync.py publishes each change to the replicas).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from inferflux.api.deps import json_body
from inferflux.api.errors import invalid_request_from
from inferflux.api.openapi import error_doc
from inferflux.api.state import LifecycleDep, ModelsDep, StateDep
from inferflux.config.manifest import ManifestEntry
from inferflux.errors import InvalidRequest
from inferflux.models.protocol import LifecycleResult, ModelLifecycle, ModelView

ADMIN_PREFIX = "/v1/admin"

router = APIRouter(prefix=ADMIN_PREFIX, tags=["admin"])

_ENTRY_FIELDS = frozenset(ManifestEntry.model_fields)


class AdminModelRequest(BaseModel):
    """One lifecycle action. `load` and `swap` take a manifest entry's fields (`load` of
    a registered id needs only `id`); `unload` and `set_default` take only `id`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Literal["load", "unload", "swap", "set_default"]
    id: str = Field(min_length=1, max_length=128)
    path: str | None = None
    sha256: str | None = None
    aliases: list[str] | None = None
    signature: str | None = None
    default: bool | None = None
    n_ctx: int | None = None
    workers: int | None = None
    n_batch: int | None = None
    threads: int | None = None
    chat_template: str | None = None
    quantization: str | None = None
    system: str | None = None  # Ollama: the model's system prompt
    parameters: dict[str, JsonValue] | None = None  # Ollama: its default options
    mmproj: str | None = None  # multimodal projector GGUF in the models folder (images in)
    mmproj_sha256: str | None = None  # required with mmproj

    def entry(self) -> ManifestEntry:
        """The fields given, as a manifest entry. Raises InvalidRequest naming a bad one."""
        fields = self.model_dump(exclude={"action"}, exclude_unset=True)
        try:
            return ManifestEntry.model_validate(fields)
        except ValidationError as exc:
            raise invalid_request_from(exc.errors()) from None

    def id_only(self) -> str:
        extra = sorted(self.model_fields_set & _ENTRY_FIELDS - {"id"})
        if extra:
            raise InvalidRequest(
                f"action {self.action} takes only `id`, not {', '.join(extra)}",
                param=extra[0],
            )
        return self.id


AdminModelBody = Annotated[AdminModelRequest, Depends(json_body(AdminModelRequest))]


def view_json(view: ModelView) -> dict[str, object]:
    """One model as the admin API shows it."""
    info = view.info
    return {
        "id": view.model_id,
        "aliases": list(view.aliases),
        "path": view.path,
        "source": view.source,
        "default": view.is_default,
        "state": view.state,
        "sha256": info.sha256 if info is not None else None,
        "mmproj": view.mmproj or None,
        "n_ctx": info.n_ctx if info is not None else None,
        "num_in_flight": view.num_in_flight,
        "load_s": None if view.load_s is None else round(view.load_s, 3),
        "idle_s": None if view.idle_s is None else round(view.idle_s, 3),
        "expires_in_s": view.expires_in_s,
        "workers": [{"pid": w.pid, "ready": w.ready} for w in view.workers],
        "error": view.error,
    }


@router.get("/models")
async def list_models(models: ModelsDep) -> dict[str, object]:
    """Every model: registered, loading, loaded, retiring or failed, with its workers."""
    return {"object": "list", "data": [view_json(view) for view in models.models()]}


async def _apply(models: ModelLifecycle, body: AdminModelRequest) -> LifecycleResult:
    if body.action == "load":
        return await models.load(body.entry() if body.path is not None else body.id_only())
    if body.action == "swap":
        if body.path is None:
            raise InvalidRequest(
                "action swap needs the new file's `path` and `sha256`", param="path"
            )
        return await models.swap(body.entry())
    if body.action == "unload":
        return await models.unload(body.id_only())
    return await models.set_default(body.id_only())


@router.post(
    "/models",
    responses={
        409: error_doc("A conflicting state: the default model, an existing id"),
        422: error_doc("The file does not verify (SHA-256, signature, path, adapter header)"),
    },
)
async def manage_model(
    models: ModelsDep, lifecycle: LifecycleDep, state: StateDep, body: AdminModelBody
) -> dict[str, object]:
    """Load, unload, swap or set the default model; answers once the change is made (and,
    with `redis.url`, published to the other replicas: api/model_sync.py)."""
    sync = state.model_sync
    if sync is None:
        change = _apply(lifecycle, body)
    else:
        loads = body.action in ("load", "swap") and body.path is not None
        change = sync.run(lambda: _apply(lifecycle, body), body.entry() if loads else None)
    # NOTE: shielded: an admin client that gives up does not undo a half-done swap.
    result = await asyncio.shield(change)
    return {
        "action": result.action,
        "id": result.model_id,
        "load_s": None if result.load_s is None else round(result.load_s, 3),
        "retiring": result.retiring,
        "persisted": result.persisted,
        "models": [view_json(view) for view in models.models()],
    }
