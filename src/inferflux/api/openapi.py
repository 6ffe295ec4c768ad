"""The OpenAPI document served at /openapi.json: FastAPI's, completed where it cannot see.

Owns: `install_openapi`, which replaces `app.openapi` with `openapi_schema`. On top of
FastAPI's document it:

- documents the request body of every route that parses its body itself through a
  `JsonBody` dependency (`api/deps.py`), which FastAPI cannot see;
- documents the error responses each operation can give (400, 404, 408, 413, 500, 503:
  see `_errors_of`) with the route's error shape: the OpenAI envelope, or `{"error": "..."}` on the
  Ollama routes (`/api/*`). A route keeps any response it declares itself (`responses=`);
- drops FastAPI's 422 responses: validation errors are 400s here (`api/errors.py`).

The document is built once, on the first request for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import BaseRoute

from inferflux.api.deps import JsonBody
from inferflux.api.errors import ANTHROPIC_PATH_PREFIX, is_ollama_path

# Any (here and below): OpenAPI documents are free-form JSON.
Document = dict[str, Any]

_REF = "#/components/schemas/{model}"
OPENAI_ERROR = "ErrorEnvelope"
OLLAMA_ERROR = "OllamaError"
ANTHROPIC_ERROR = "AnthropicError"
_ERROR_REF = _REF.format(model=OPENAI_ERROR)
_ERROR_SCHEMAS: dict[str, Document] = {
    OPENAI_ERROR: {
        "title": OPENAI_ERROR,
        "description": 'The OpenAI error envelope: {"error": {"message", "type", "param", "code"}}',
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    OLLAMA_ERROR: {
        "title": OLLAMA_ERROR,
        "description": 'Ollama\'s error shape: {"error": "..."}',
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
    },
    ANTHROPIC_ERROR: {
        "title": ANTHROPIC_ERROR,
        "description": 'Anthropic\'s error shape: {"type": "error", "error": {"type", "message"}}',
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}
_ERROR_DESCRIPTIONS = {
    "400": "Invalid request (malformed JSON, a bad field, a prompt over the context)",
    "404": "Unknown model or resource",
    "408": "The request waited in the queue too long",
    "413": "The request body is larger than server.max_request_bytes",
    "500": "Internal or engine error",
    "503": "No engine worker is ready, or the queue is full (see Retry-After)",
}


def install_openapi(app: FastAPI, event_models: Sequence[type[BaseModel]] = ()) -> None:
    """Serve `openapi_schema(app, event_models)` at the app's `openapi_url`."""

    def openapi() -> Document:
        return openapi_schema(app, event_models)

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override


def error_doc(description: str, shape: str = OPENAI_ERROR) -> Document:
    """A `responses=` entry for an error a route gives beyond `_errors_of`: the OpenAI
    envelope, or `OLLAMA_ERROR` for a route under /api/ (its errors are Ollama's shape)."""
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model=shape)}}},
    }


def event_stream(model_name: str) -> Document:
    """The `content` entry of an SSE response whose every event is `data: <JSON>` holding
    the component `model_name` (one of the `event_models`) or the OpenAI error envelope.

    Schemathesis (and Open API 3.1 readers) take the schema of `text/event-stream` to
    describe one event: `{"data": "...", "event": "message", "id"?: ...}`.
    """
    data_schema = {"anyOf": [{"$ref": _REF.format(model=model_name)}, {"$ref": _ERROR_REF}]}
    return {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": data_schema,
                    }
                },
            }
        }
    }


def openapi_schema(app: FastAPI, event_models: Sequence[type[BaseModel]] = ()) -> Document:
    """The completed document (cached on `app.openapi_schema`); `event_models` are added
    to the components for `event_stream` references. Raises ValueError if one of them
    clashes with another component of the same name."""
    if app.openapi_schema:
        return app.openapi_schema
    document = get_openapi(
        title=app.title,
        version=app.version,
        description="InferFlux: OpenAI-, Ollama-compatible and native LLM inference API",
        routes=app.routes,
    )
    components: Document = document.setdefault("components", {}).setdefault("schemas", {})
    components.update(_ERROR_SCHEMAS)
    body_refs = _add_body_schemas(components, list(api_routes(app.routes)))
    _add_event_schemas(components, event_models)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            ref = body_refs.get((path, method))
            if ref is not None:
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": ref}}},
                }
            _document_errors(operation, path)
    _drop_unused_validation_schemas(document, components)
    app.openapi_schema = document
    return document


def api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute, including those of included routers (FastAPI >= 0.16x keeps them in
    wrapper routes that hold the `original_router`). Routers are included without a prefix
    here, so a route's `path_format` is its path in the document."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
            continue
        router = getattr(route, "original_router", None)
        yield from api_routes(getattr(router or route, "routes", None) or [])


def body_model(dependant: Dependant) -> type[BaseModel] | None:
    """The model a route's `JsonBody` dependency parses, if it has one."""
    for dependency in dependant.dependencies:
        if isinstance(dependency.call, JsonBody):
            model: type[BaseModel] = dependency.call.body_model
            return model
        found = body_model(dependency)
        if found is not None:
            return found
    return None


def _add_body_schemas(components: Document, routes: list[APIRoute]) -> dict[tuple[str, str], str]:
    """Add the schemas of every `JsonBody` model; map (path, method) → the body's `$ref`."""
    models = {
        (route.path_format, method.lower()): body_model(route.dependant)
        for route in routes
        for method in route.methods or ()
    }
    distinct = list(dict.fromkeys(model for model in models.values() if model is not None))
    if not distinct:
        return {}
    keys, definitions = models_json_schema(
        [(model, "validation") for model in distinct], ref_template=_REF
    )
    renames = _merge_definitions(components, definitions.get("$defs", {}))
    refs: dict[tuple[str, str], str] = {}
    for operation, model in models.items():
        if model is not None:
            ref = str(keys[(model, "validation")]["$ref"])
            refs[operation] = renames.get(ref, ref)
    return refs


def _add_event_schemas(components: Document, models: Sequence[type[BaseModel]]) -> None:
    if not models:
        return
    _, definitions = models_json_schema(
        [(model, "serialization") for model in models], ref_template=_REF
    )
    for name, schema in definitions.get("$defs", {}).items():
        if components.setdefault(name, schema) != schema:
            raise ValueError(f"the OpenAPI component {name} has two different schemas")


def _merge_definitions(components: Document, definitions: Document) -> dict[str, str]:
    """Add `definitions` to `components`; a name FastAPI already used for a different
    schema gets a suffix. Returns the `$ref`s that changed (old → new)."""
    renames: dict[str, str] = {}
    for name, schema in definitions.items():
        if name in components and components[name] != schema:
            new_name = next(f"{name}{n}" for n in range(2, 1000) if f"{name}{n}" not in components)
            renames[_REF.format(model=name)] = _REF.format(model=new_name)
            components[new_name] = None  # reserve the name
    text = json.dumps(definitions)
    for old, new in renames.items():
        text = text.replace(json.dumps(old), json.dumps(new))
    for name, schema in json.loads(text).items():
        target = renames.get(_REF.format(model=name), _REF.format(model=name))
        components[target.rsplit("/", 1)[1]] = schema
    return renames


def _document_errors(operation: Document, path: str) -> None:
    """Add the error responses this kind of operation can give (see `_errors_of`)."""
    responses: Document = operation.setdefault("responses", {})
    responses.pop("422", None)
    schema = OPENAI_ERROR
    if is_ollama_path(path):
        schema = OLLAMA_ERROR
    elif path.startswith(ANTHROPIC_PATH_PREFIX):
        schema = ANTHROPIC_ERROR
    content = {"application/json": {"schema": {"$ref": _REF.format(model=schema)}}}
    for status in _errors_of(operation):
        description = _ERROR_DESCRIPTIONS[status]
        responses.setdefault(status, {"description": description, "content": content})


def _errors_of(operation: Document) -> list[str]:
    """Every operation can fail (500). One with parameters or a body can be invalid (400)
    or name what does not exist (404); one with a body can be too large (413) and, since
    it may queue work for the engine, time out in the queue (408) or meet backpressure or
    no ready worker (503)."""
    has_body = "requestBody" in operation
    statuses = ["500"]
    if has_body or operation.get("parameters"):
        statuses += ["400", "404"]
    if has_body:
        statuses += ["408", "413", "503"]
    return sorted(statuses)


def _drop_unused_validation_schemas(document: Document, components: Document) -> None:
    """FastAPI's 422 schemas, unless something still refers to them."""
    text = json.dumps(document["paths"])
    for name in ("HTTPValidationError", "ValidationError"):
        if name in components and _REF.format(model=name) not in text:
            del components[name]
