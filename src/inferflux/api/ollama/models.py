"""Ollama's model routes: `/api/tags`, `/api/show`, `/api/ps`, `/api/version`, and `/`.

Owns: Ollama model names (the served id, also with `:latest`; `resolve_model`), the
model descriptions Ollama clients read (`details`, `model_info`, `modelfile`,
`parameters`), and the liveness text at `/`. GGUF facts (parameter count, quantization,
metadata keys) come from `engine/gguf_metadata.py`, read once per model file off the
event loop.

Honest differences from Ollama: `digest` identifies the served file (a SHA-256 of its id,
size and mtime), not its content; `template` is the Jinja chat template InferFlux renders
(Ollama's are Go templates); `modelfile` is descriptive only; the model never unloads, so
`/api/ps` reports it with an `expires_at` ~292 years ahead (Ollama's "forever").
"""

from __future__ import annotations

import functools
import hashlib
import time
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends
from starlette.responses import PlainTextResponse, Response

from inferflux.api.deps import ServingDep, ServingState, json_body
from inferflux.api.ollama.protocol import (
    DEFAULT_REPEAT_LAST_N,
    DEFAULT_REPEAT_PENALTY,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    OllamaShowRequest,
)
from inferflux.api.ollama.responder import json_response, rfc3339_nano
from inferflux.engine.gguf_metadata import GgufMetadata, read_gguf_metadata
from inferflux.engine.protocol import ModelInfo
from inferflux.errors import InvalidRequest, ModelNotFound
from inferflux.security.principal import current_principal
from inferflux.security.rbac import authorize_model

router = APIRouter(tags=["ollama"])
ShowBody = Annotated[OllamaShowRequest, Depends(json_body(OllamaShowRequest))]

# The Ollama API version whose wire format these routes follow (clients gate features on it).
OLLAMA_COMPAT_VERSION = "0.12.0"
OLLAMA_RUNNING = "Ollama is running"
_FOREVER_NS = 2**63 - 1  # Go's maximal time.Duration: Ollama's "never expires"
_PARAMETER_WIDTH = 30


def ollama_name(info: ModelInfo) -> str:
    """The served model as Ollama names it: `<id>:latest` unless the id has a tag."""
    return info.model_id if ":" in info.model_id else f"{info.model_id}:latest"


def resolve_model(requested: str | None, info: ModelInfo) -> str:
    """The name to answer with (the client's spelling). Raises InvalidRequest (400) when
    it is missing, ModelNotFound (404, Ollama's message) when it is not served and
    PermissionDenied (403) when it is outside the caller's `allowed_models`."""
    if not requested:
        raise InvalidRequest("model is required", param="model")
    if requested in (info.model_id, ollama_name(info)):
        authorize_model(info.model_id, ollama_name(info))
        return requested
    raise ModelNotFound(f"model '{requested}' not found", param="model")


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


@functools.lru_cache(maxsize=4)
def _metadata(path: str, size_bytes: int, mtime: int) -> GgufMetadata:
    return read_gguf_metadata(path)  # size and mtime: a replaced file is read again


async def gguf_metadata(info: ModelInfo) -> GgufMetadata:
    """The served file's GGUF header (parsed once, on a worker thread)."""
    return await anyio.to_thread.run_sync(_metadata, info.path, info.size_bytes, info.created)


def digest(info: ModelInfo) -> str:
    """A stable identity of the served file (not a content hash: see the module doc)."""
    key = f"{info.model_id}|{info.size_bytes}|{info.created}"
    return hashlib.sha256(key.encode()).hexdigest()


def details(info: ModelInfo, meta: GgufMetadata) -> dict[str, object]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture],
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


def parameters_text(info: ModelInfo) -> str:
    """Ollama's `parameters`: the defaults a request gets, one `name value` per line."""
    defaults: list[tuple[str, object]] = [
        ("num_ctx", info.n_ctx),
        ("repeat_last_n", DEFAULT_REPEAT_LAST_N),
        ("repeat_penalty", DEFAULT_REPEAT_PENALTY),
        ("temperature", DEFAULT_TEMPERATURE),
        ("top_k", DEFAULT_TOP_K),
        ("top_p", DEFAULT_TOP_P),
    ]
    return "\n".join(f"{name:<{_PARAMETER_WIDTH}} {value}" for name, value in defaults)


def modelfile_text(info: ModelInfo, template: str) -> str:
    parameters = "\n".join(f"PARAMETER {line}" for line in parameters_text(info).splitlines())
    return (
        "# Modelfile generated by InferFlux (descriptive: InferFlux serves this GGUF as is)\n"
        f"# FROM {ollama_name(info)}\n\n"
        f"FROM {info.path}\n"
        f'TEMPLATE """{template}"""\n'
        f"{parameters}\n"
    )


def show_body(serving: ServingState, meta: GgufMetadata) -> dict[str, object]:
    info = serving.model_info
    template = serving.chat_template.source
    license_text = meta.values.get("general.license")
    return {
        "license": license_text if isinstance(license_text, str) else "",
        "modelfile": modelfile_text(info, template),
        "parameters": parameters_text(info),
        "template": template,
        "details": details(info, meta),
        "model_info": model_info_map(info, meta),
        "capabilities": ["completion", "tools"],  # tools: every template (generic format)
        "modified_at": rfc3339_nano(info.created * 1_000_000_000),
    }


@router.get("/api/tags")
async def list_models(serving: ServingDep) -> Response:
    """The served model, in Ollama's `/api/tags` shape (none outside `allowed_models`)."""
    info = serving.model_info
    if not current_principal().may_use_model(info.model_id):
        return json_response({"models": []})
    meta = await gguf_metadata(info)
    return json_response({"models": [model_entry(info, meta)]})


@router.post("/api/show")
async def show_model(serving: ServingDep, body: ShowBody) -> Response:
    """Details, parameters, template and GGUF metadata of the served model."""
    resolve_model(body.model or body.name, serving.model_info)
    meta = await gguf_metadata(serving.model_info)
    return json_response(show_body(serving, meta))


@router.get("/api/ps")
async def running_models(serving: ServingDep) -> Response:
    """The loaded model: always the served one while a worker is ready."""
    info = serving.model_info
    if not serving.engine.ready:
        return json_response({"models": []})
    meta = await gguf_metadata(info)
    entry = model_entry(info, meta)
    del entry["modified_at"]
    gpu = serving.settings.runtime.n_gpu_layers != 0
    entry["expires_at"] = rfc3339_nano(time.time_ns() + _FOREVER_NS)
    entry["size_vram"] = info.size_bytes if gpu else 0
    entry["context_length"] = info.n_ctx
    return json_response({"models": [entry]})


@router.get("/api/version")
async def version() -> Response:
    """The Ollama API version these routes follow."""
    return json_response({"version": OLLAMA_COMPAT_VERSION})


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def root() -> PlainTextResponse:
    """What Ollama answers at `/`; clients probe it to see that a server is there."""
    return PlainTextResponse(OLLAMA_RUNNING)
