"""Ollama's model management: `/api/delete`, `/api/copy`, `/api/create` (admin scope).

ADMIN-ONLY: the app attaches `require_scope(Scope.ADMIN)` to this router. Each change is
a lifecycle operation (models/lifecycle.py), written to the manifest when the server has
one, so `ollama rm/cp/create` survive a restart:

- delete: the model is unloaded and forgotten (its entry removed; an uploaded blob no
  model uses any more is deleted). The default model cannot be deleted (409).
- copy: a new, independent model (its own entry) serving the source's file with the
  source's settings; it can later get its own system prompt with `create`.
- create: from `from` (a model, or a GGUF file in the models folder) or `files` (one
  GGUF blob uploaded first through `/api/blobs`), with `system`, `template` (a Jinja chat
  template: InferFlux does not run Go templates) and `parameters` (Ollama options; the
  defaults of every Ollama chat and generate on the model). An existing model of that
  name is replaced (swapped when loaded). The model loads on first use.

Ollama names carry a tag; InferFlux ids have none, so `name` and `name:latest` are the
same model and other tags are refused (400). Refused as not supported: `quantize`,
`adapters` (use POST /v1/admin/adapters), `messages`. `license` is accepted and ignored.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from starlette.responses import Response

from inferflux.api.admin.changes import record_change
from inferflux.api.deps import json_body
from inferflux.api.errors import invalid_request_from
from inferflux.api.model_cards import find_view
from inferflux.api.ollama.render import NdjsonResponse, json_response, ndjson_line
from inferflux.api.state import AppState, LifecycleDep, ModelsDep, StateDep
from inferflux.config.manifest import MODEL_NAME_PATTERN, ManifestEntry, ModelParameters
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.model_verify import resolve_in_folder, sha256_of_path
from inferflux.errors import InvalidRequest, ModelLoadError, ModelNotFound
from inferflux.models.blobs import BLOBS_FOLDER, BlobStore, digest_hex
from inferflux.models.manifest_store import entry_fields
from inferflux.models.protocol import ModelDirectory, ModelLifecycle

router = APIRouter(tags=["ollama"])

_LATEST = ":latest"
_PARAMETER_NAMES = frozenset(ModelParameters.model_fields)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class OllamaDeleteRequest(_Body):
    model: str | None = Field(None, max_length=256)
    name: str | None = Field(None, max_length=256)  # older clients


class OllamaCopyRequest(_Body):
    source: str = Field(min_length=1, max_length=256)
    destination: str = Field(min_length=1, max_length=256)


class OllamaCreateRequest(_Body):
    model: str | None = Field(None, max_length=256)
    name: str | None = Field(None, max_length=256)  # older clients
    from_: str | None = Field(None, alias="from", max_length=4096)
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    template: str | None = Field(None, max_length=1_000_000)
    system: str | None = Field(None, max_length=100_000)
    parameters: dict[str, JsonValue] | None = None
    license: str | list[str] | None = None  # accepted, ignored
    messages: list[JsonValue] | None = None
    quantize: str | None = None
    stream: bool | None = None


DeleteBody = Annotated[OllamaDeleteRequest, Depends(json_body(OllamaDeleteRequest))]
CopyBody = Annotated[OllamaCopyRequest, Depends(json_body(OllamaCopyRequest))]
CreateBody = Annotated[OllamaCreateRequest, Depends(json_body(OllamaCreateRequest))]


def model_id_of(name: str | None, param: str) -> str:
    """The InferFlux id of an Ollama name (`id` or `id:latest`). Raises InvalidRequest."""
    if not name:
        raise InvalidRequest(f"{param} is required", param=param)
    model_id = name.removesuffix(_LATEST)
    if ":" in model_id:
        raise InvalidRequest(
            f"invalid model name {name!r}: InferFlux model ids have no tags (use "
            f"'{model_id.split(':')[0]}' or '{model_id.split(':')[0]}:latest')",
            param=param,
        )
    if re.fullmatch(MODEL_NAME_PATTERN, model_id) is None:
        raise InvalidRequest(
            f"invalid model name {name!r}: it must match {MODEL_NAME_PATTERN}", param=param
        )
    return model_id


def _entry(fields: dict[str, object]) -> ManifestEntry:
    try:
        return ManifestEntry.model_validate(fields)
    except ValidationError as exc:
        raise invalid_request_from(exc.errors()) from None


def _forget_blob(models: ModelDirectory, blobs: BlobStore, path: Path) -> None:
    """Delete the uploaded blob at `path` once no registered model serves it."""
    if path.parent != blobs.folder.resolve() or any(
        Path(view.path) == path for view in models.models() if view.listed()
    ):  # a retiring model keeps its open file until its workers stop
        return
    blobs.remove(f"{BLOBS_FOLDER}/{path.name}")


def blob_store(lifecycle: ModelLifecycle, state: AppState) -> BlobStore:
    return BlobStore(lifecycle.models_dir, state.settings.registry.max_blob_bytes)


def _record(request: Request, action: str, target: str, **details: object) -> None:
    """An admin change, logged and audited like every admin API change."""
    record_change(request, f"{action}:{target}", details)


@router.delete("/api/delete")
async def delete_model(
    request: Request, body: DeleteBody, models: ModelsDep, lifecycle: LifecycleDep, state: StateDep
) -> Response:
    """Unload and forget a model (its manifest entry removed); 404 for an unknown one,
    409 for the default model."""
    name = body.model or body.name
    if not name:
        raise InvalidRequest("model is required", param="model")
    view = find_view(models.models(), name)
    if view is None or view.adapter_of is not None:
        raise ModelNotFound(f"model '{name}' not found", param="model")
    result = await lifecycle.unload(view.model_id, forget=True)
    _record(request, "model.delete", view.model_id, persisted=result.persisted)
    path = Path(view.path)
    await anyio.to_thread.run_sync(_forget_blob, models, blob_store(lifecycle, state), path)
    return Response(status_code=200)


@router.post("/api/copy")
async def copy_model(request: Request, body: CopyBody, lifecycle: LifecycleDep) -> Response:
    """A new model serving the source's file with its settings; 404 for an unknown
    source. A destination that exists is replaced."""
    source = await lifecycle.entry_of(body.source)
    destination = model_id_of(body.destination, "destination")
    if destination != source.id:
        result = await lifecycle.register(_entry({**entry_fields(source), "id": destination}))
        details = {"source": source.id, "persisted": result.persisted}
        _record(request, "model.copy", destination, **details)
    return Response(status_code=200)


@router.post("/api/create")
async def create_model(
    request: Request, body: CreateBody, lifecycle: LifecycleDep, state: StateDep
) -> Response:
    """Register a model from a model, a GGUF file or an uploaded blob, with a system
    prompt, chat template and default options; NDJSON progress unless `stream` is
    false."""
    model_id = model_id_of(body.model or body.name, "model")
    _refuse_unsupported(body)
    base = await _base_fields(body, lifecycle, blob_store(lifecycle, state))
    fields = {**base, "id": model_id}
    if body.template is not None:
        _check_template(body.template)
        fields["chat_template"] = body.template
    if body.system is not None:
        fields["system"] = body.system
    if body.parameters is not None:
        fields.update(_parameters(body.parameters, base.get("parameters")))
    entry = _entry(fields)
    result = await lifecycle.register(entry)
    details = {"sha256": entry.sha256, "persisted": result.persisted}
    _record(request, "model.create", entry.id, **details)
    statuses = [f"using existing layer sha256:{entry.sha256}", "writing manifest", "success"]
    if body.stream is False:
        return json_response({"status": "success"})

    async def lines() -> AsyncGenerator[bytes, None]:
        for status in statuses:
            yield ndjson_line({"status": status})

    return NdjsonResponse(lines())


def _refuse_unsupported(body: OllamaCreateRequest) -> None:
    if body.quantize:
        raise InvalidRequest(
            "quantize is not supported by create: upload or name an already quantized GGUF",
            param="quantize",
        )
    if body.adapters:
        raise InvalidRequest(
            "adapters are not supported by create: load a LoRA adapter with "
            "POST /v1/admin/adapters",
            param="adapters",
        )
    if body.messages:
        raise InvalidRequest("messages are not supported by create", param="messages")
    if body.from_ and body.files:
        raise InvalidRequest("send either `from` or `files`, not both", param="files")
    if not body.from_ and not body.files:
        raise InvalidRequest(
            "create needs `from` (a model, or a GGUF file in the models folder) or "
            "`files` (one GGUF uploaded through POST /api/blobs/sha256:<digest>)",
            param="from",
        )


async def _base_fields(
    body: OllamaCreateRequest, lifecycle: ModelLifecycle, blobs: BlobStore
) -> dict[str, object]:
    """The file (and, from a model, its settings) the new model starts from."""
    if body.files:
        return _blob_fields(body.files, blobs)
    source = str(body.from_)
    try:
        entry = await lifecycle.entry_of(source)
    except ModelNotFound:
        if not source.endswith(".gguf"):
            raise
    else:
        return entry_fields(entry)
    path = resolve_in_folder(lifecycle.models_dir, source)  # 422 outside the folder
    try:
        sha256 = await anyio.to_thread.run_sync(sha256_of_path, path)
    except ModelLoadError:
        raise InvalidRequest(
            f"no GGUF file {source!r} in the models folder (registry.models_dir)", param="from"
        ) from None
    return {"path": source, "sha256": sha256}


def _blob_fields(files: dict[str, str], blobs: BlobStore) -> dict[str, object]:
    if len(files) != 1:
        raise InvalidRequest(
            f"files must name one GGUF file, not {len(files)} (InferFlux serves one file "
            "per model)",
            param="files",
        )
    ((name, digest),) = files.items()
    sha256 = digest_hex(digest)
    if not blobs.exists(sha256):
        raise InvalidRequest(
            f"the blob {digest} of {name!r} was not uploaded: POST it to /api/blobs/{digest}",
            param="files",
        )
    return {"path": blobs.relative_path(sha256), "sha256": sha256}


def _check_template(template: str) -> None:
    try:
        ChatTemplate.from_model(template, "llama", "", "")
    except ModelLoadError as exc:
        raise InvalidRequest(
            f"{exc.message}: InferFlux chat templates are Jinja (as in Hugging Face "
            "tokenizer_config.json), not Ollama's Go templates",
            param="template",
        ) from None


def _parameters(raw: dict[str, JsonValue], base: object) -> dict[str, object]:
    """`parameters` as entry fields: `num_ctx` → `n_ctx`, the sampling options over the
    base model's. Raises InvalidRequest naming an unknown or invalid one."""
    values: dict[str, object] = dict(base) if isinstance(base, dict) else {}
    values.update(raw)
    fields: dict[str, object] = {}
    if "num_ctx" in values:
        fields["n_ctx"] = values.pop("num_ctx")
    unknown = sorted(set(values) - _PARAMETER_NAMES)
    if unknown:
        supported = ", ".join(["num_ctx", *sorted(_PARAMETER_NAMES)])
        raise InvalidRequest(
            f"parameter {unknown[0]!r} is not supported (supported: {supported})",
            param=f"parameters.{unknown[0]}",
        )
    if isinstance(values.get("stop"), str):
        values["stop"] = [values["stop"]]
    try:
        parameters = ModelParameters.model_validate(values)
    except ValidationError as exc:
        errors = [{**e, "loc": ("parameters", *e["loc"])} for e in exc.errors()]
        raise invalid_request_from(errors) from None
    fields["parameters"] = parameters.options() or None
    return fields
