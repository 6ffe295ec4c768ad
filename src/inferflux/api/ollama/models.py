"""Ollama's model routes: `/api/tags`, `/api/show`, `/api/ps`, `/api/version`, and `/`.

Owns: Ollama model names (ids and aliases, also with `:latest`; `resolve_model`), the
model descriptions Ollama clients read (`details`, `model_info`, `modelfile`,
`parameters`, `capabilities`; a model with an mmproj: `vision` among its capabilities,
`clip` among its families and its projector's header as `projector_info`, as Ollama shows
a vision model), and the liveness text at `/`. GGUF facts (parameter count, quantization,
metadata keys, MoE experts) come from `engine/gguf_metadata.py`, read once per model file
off the event loop; a registered model that is not loaded is described from its file
without loading it.

Honest differences from Ollama: `digest` is the file's SHA-256 when the registry
verified it, else a SHA-256 of its id, size and mtime (the single `model.path` without
`model.sha256`); `template` is the Jinja chat template InferFlux renders (Ollama's are Go
templates); `modelfile` is descriptive only; `/api/ps` shows a model without keep_alive
(the default model always) with an `expires_at` ~292 years ahead (Ollama's "forever").
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends
from starlette.responses import PlainTextResponse, Response

from inferflux.api.deps import json_body
from inferflux.api.model_cards import (
    find_view,
    human_number,
    may_see,
    provisional_info,
    registered_metadata,
)
from inferflux.api.ollama.protocol import (
    DEFAULT_REPEAT_LAST_N,
    DEFAULT_REPEAT_PENALTY,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    OllamaShowRequest,
)
from inferflux.api.ollama.render import json_response, rfc3339_nano
from inferflux.api.state import ContextDep, ModelsDep
from inferflux.config.manifest import ModelParameters
from inferflux.engine.chat_template import fallback_template
from inferflux.engine.gguf_metadata import GgufMetadata, read_gguf_metadata
from inferflux.engine.model_verify import MMPROJ_ARCHITECTURE
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import InvalidRequest, ModelLoadError, ModelNotFound
from inferflux.models.protocol import ModelView
from inferflux.security.principal import Principal
from inferflux.security.rbac import authorize_model

router = APIRouter(tags=["ollama"])
ShowBody = Annotated[OllamaShowRequest, Depends(json_body(OllamaShowRequest))]

__all__ = ["human_number", "ollama_name", "parameters_text", "resolve_model", "router"]

# The Ollama API version whose wire format these routes follow (clients gate features on it).
OLLAMA_COMPAT_VERSION = "0.12.0"
OLLAMA_RUNNING = "Ollama is running"
_FOREVER_NS = 2**63 - 1  # Go's maximal time.Duration: Ollama's "never expires"
_PARAMETER_WIDTH = 30


def ollama_name(info: ModelInfo) -> str:
    """The model as Ollama names it: `<id>:latest` unless the id has a tag."""
    return info.model_id if ":" in info.model_id else f"{info.model_id}:latest"


def resolve_model(requested: str | None, info: ModelInfo, principal: Principal) -> str:
    """The name to answer with (the client's spelling). Raises InvalidRequest (400) when
    it is missing, ModelNotFound (404, Ollama's message) when it is not this model and
    PermissionDenied (403) when it is outside the caller's `allowed_models`."""
    if not requested:
        raise InvalidRequest("model is required", param="model")
    if requested == ollama_name(info) or info.serves(requested.removesuffix(":latest")):
        authorize_model(principal, *info.access_names(), ollama_name(info))
        return requested
    raise ModelNotFound(f"model '{requested}' not found", param="model")


@functools.lru_cache(maxsize=16)
def _metadata(path: str, size_bytes: int, mtime: int) -> GgufMetadata:
    return read_gguf_metadata(path)  # size and mtime: a replaced file is read again


async def gguf_metadata(info: ModelInfo) -> GgufMetadata:
    """A loaded model's GGUF header (parsed once, on a worker thread)."""
    return await anyio.to_thread.run_sync(_metadata, info.path, info.size_bytes, info.created)


def digest(info: ModelInfo) -> str:
    """The file's SHA-256 when the registry verified it, else a stable identity of the
    file (see the module doc)."""
    if info.sha256:
        return info.sha256
    key = f"{info.model_id}|{info.size_bytes}|{info.created}"
    return hashlib.sha256(key.encode()).hexdigest()


def details(info: ModelInfo, meta: GgufMetadata) -> dict[str, object]:
    # a model with an mmproj: families lists its projector's `clip` too, as Ollama's do
    families = [info.architecture, MMPROJ_ARCHITECTURE] if info.vision else [info.architecture]
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": families,
        "parameter_size": human_number(meta.num_parameters),
        "quantization_level": meta.quantization_name,
    }


def model_entry(info: ModelInfo, meta: GgufMetadata) -> dict[str, object]:
    """The model as `/api/tags` lists it."""
    name = ollama_name(info)
    return {
        "name": name,
        "model": name,
        "modified_at": rfc3339_nano(info.created * 1_000_000_000),
        "size": info.size_bytes,
        "digest": digest(info),
        "details": details(info, meta),
    }


def model_info_map(info: ModelInfo, meta: GgufMetadata) -> dict[str, object]:
    """Ollama's `model_info`: the GGUF's metadata keys (arrays as null, the chat template
    left out: it is `template`) plus `general.parameter_count`."""
    values: dict[str, object] = {
        key: value
        for key, value in meta.values.items()
        if not key.startswith("tokenizer.chat_template")
    }
    values.setdefault("general.architecture", info.architecture)
    values["general.parameter_count"] = meta.num_parameters
    values.setdefault(f"{info.architecture}.context_length", info.n_ctx_train)
    return dict(sorted(values.items()))


def parameters_text(info: ModelInfo, model: ModelParameters | None = None) -> str:
    """Ollama's `parameters`: the defaults a request gets (the model's own `parameters`
    over Ollama's), one `name value` per line (`stop` once per sequence)."""
    values: dict[str, object] = {
        "num_ctx": info.n_ctx,
        "repeat_last_n": DEFAULT_REPEAT_LAST_N,
        "repeat_penalty": DEFAULT_REPEAT_PENALTY,
        "temperature": DEFAULT_TEMPERATURE,
        "top_k": DEFAULT_TOP_K,
        "top_p": DEFAULT_TOP_P,
    }
    values.update(model.options() if model is not None else {})
    lines = []
    for name, value in sorted(values.items()):
        for item in value if isinstance(value, list) else [value]:
            shown = json.dumps(item) if isinstance(item, str) else _number(item)
            lines.append(f"{name:<{_PARAMETER_WIDTH}} {shown}")
    return "\n".join(lines)


def _number(value: object) -> str:
    """Go's formatting of an option's value: `0`, `0.8`, `4096`."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def modelfile_text(
    info: ModelInfo, template: str, parameters: str, system: str | None = None
) -> str:
    lines = "\n".join(f"PARAMETER {line}" for line in parameters.splitlines())
    system_line = f'SYSTEM """{system}"""\n' if system else ""
    return (
        "# Modelfile generated by InferFlux (descriptive: InferFlux serves this GGUF as is)\n"
        f"# FROM {ollama_name(info)}\n\n"
        f"FROM {info.path}\n"
        f'TEMPLATE """{template}"""\n'
        f"{system_line}{lines}\n"
    )


def show_body(
    info: ModelInfo, template: str, meta: GgufMetadata, view: ModelView | None = None
) -> dict[str, object]:
    """`/api/show`'s answer; `view` adds the model's own system prompt and parameters."""
    license_text = meta.values.get("general.license")
    system = view.system if view is not None else None
    parameters = parameters_text(info, view.parameters if view is not None else None)
    body: dict[str, object] = {
        "license": license_text if isinstance(license_text, str) else "",
        "modelfile": modelfile_text(info, template, parameters, system),
        "parameters": parameters,
        "template": template,
        "details": details(info, meta),
        "model_info": model_info_map(info, meta),
        # tools: every template (generic format); vision: an mmproj (Ollama's order)
        "capabilities": ["completion", "tools", "vision"]
        if info.vision
        else ["completion", "tools"],
        "modified_at": rfc3339_nano(info.created * 1_000_000_000),
    }
    if system:
        body["system"] = system
    return body


async def projector_info(info: ModelInfo) -> dict[str, object] | None:
    """Ollama's `projector_info`: the scalar keys of the model's mmproj GGUF header (None
    without an mmproj or when its file cannot be read)."""
    if not info.mmproj:
        return None
    meta = await registered_metadata(info.mmproj)
    return None if meta is None else dict(sorted(meta.values.items()))


async def _described(view: ModelView) -> tuple[ModelInfo, GgufMetadata] | None:
    """A model's facts: the loaded model's, else its file header's (None: unreadable)."""
    if view.info is not None:
        try:
            return view.info, await gguf_metadata(view.info)
        except ModelLoadError:  # the file went away under a loaded model: not listable
            return None
    meta = await registered_metadata(view.path)
    return None if meta is None else (provisional_info(view, meta), meta)


@router.get("/api/tags")
async def list_models(models: ModelsDep, context: ContextDep) -> Response:
    """Every registered model the caller may use (`allowed_models`), in Ollama's
    `/api/tags` shape (loaded or not)."""
    entries = []
    for view in models.models():
        visible = view.listed() and may_see(view, context.caller)
        described = await _described(view) if visible else None
        if described is not None:
            entries.append(model_entry(*described))
    return json_response({"models": entries})


@router.post("/api/show")
async def show_model(models: ModelsDep, body: ShowBody, context: ContextDep) -> Response:
    """Details, parameters, template and GGUF metadata of a model; a model that is not
    loaded is described from its file, without loading it."""
    name = body.model or body.name
    if not name:
        raise InvalidRequest("model is required", param="model")
    view = find_view(models.models(), name)
    described = await _described(view) if view is not None else None
    if view is None or described is None:
        raise ModelNotFound(f"model '{name}' not found", param="model")
    info, meta = described
    authorize_model(context.caller, *info.access_names(), ollama_name(info))
    serving = models.resident(view.model_id)
    if serving is not None:
        template = serving.chat_template.source
    else:
        chat = view.chat_template or meta.values.get("tokenizer.chat_template")
        template = chat if isinstance(chat, str) else fallback_template(info.architecture)
    shown = show_body(info, template, meta, view)
    projector = await projector_info(info)
    if projector is not None:
        shown["projector_info"] = projector
    return json_response(shown)


@router.get("/api/ps")
async def running_models(models: ModelsDep, context: ContextDep) -> Response:
    """The loaded models the caller may use whose engine takes requests, with their
    keep_alive deadline."""
    entries = []
    for view in models.models():
        loaded = view.state == "loaded" and may_see(view, context.caller)
        serving = models.resident(view.model_id) if loaded else None
        if serving is None or not serving.engine.ready:
            continue
        info = serving.model_info
        entry = model_entry(info, await gguf_metadata(info))
        del entry["modified_at"]
        # offloaded: a ready worker runs on a GPU (none does after a GPU → CPU fallback)
        gpu = any(w.ready and w.backend != "cpu" for w in serving.engine.workers())
        left_ns = _FOREVER_NS if view.expires_in_s is None else int(view.expires_in_s * 1e9)
        entry["expires_at"] = rfc3339_nano(time.time_ns() + left_ns)
        entry["size_vram"] = info.size_bytes if gpu else 0
        entry["context_length"] = info.n_ctx
        entries.append(entry)
    return json_response({"models": entries})


@router.get("/api/version")
async def version() -> Response:
    """The Ollama API version these routes follow."""
    return json_response({"version": OLLAMA_COMPAT_VERSION})


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> PlainTextResponse:
    """What Ollama answers at `/`; clients probe it to see that a server is there."""
    return PlainTextResponse(OLLAMA_RUNNING)
