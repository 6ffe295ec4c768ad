"""/openapi.json documents every route: request bodies parsed by `JsonBody`, error
responses in the route's shape, the native SSE events, and only references that resolve."""

from __future__ import annotations

import json
import re
from typing import Annotated

import httpx
from fastapi import Depends, FastAPI
from pydantic import BaseModel

from inferflux.api.deps import json_body
from inferflux.api.openapi import api_routes, body_model, openapi_schema

REF = re.compile(r'"\$ref": "#/components/schemas/([^"]+)"')


async def document(client: httpx.AsyncClient) -> dict[str, object]:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


async def test_every_reference_resolves_and_no_422(client: httpx.AsyncClient) -> None:
    doc = await document(client)
    text = json.dumps(doc)
    components = doc["components"]["schemas"]  # type: ignore[index]
    assert set(REF.findall(text)) <= set(components)
    assert '"422"' not in text and "HTTPValidationError" not in components


async def test_post_routes_document_their_bodies(client: httpx.AsyncClient) -> None:
    paths = (await document(client))["paths"]
    expected = {
        "/v1/chat/completions": "ChatCompletionRequest",
        "/v1/completions": "CompletionRequest",
        "/generate": "NativeGenerateRequest",
        "/chat": "NativeChatRequest",
    }
    for path, model in expected.items():
        body = paths[path]["post"]["requestBody"]  # type: ignore[index]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{model}"
        }


async def test_error_responses_use_the_envelope(client: httpx.AsyncClient) -> None:
    paths = (await document(client))["paths"]
    chat = paths["/generate"]["post"]["responses"]  # type: ignore[index]
    assert {"200", "400", "404", "408", "413", "500", "503"} <= set(chat)
    schema = chat["413"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/ErrorEnvelope"}
    assert set(paths["/livez"]["get"]["responses"]) == {"200", "500"}  # type: ignore[index]
    assert "503" in paths["/readyz"]["get"]["responses"]  # type: ignore[index]


async def test_native_routes_document_json_and_sse(client: httpx.AsyncClient) -> None:
    doc = await document(client)
    ok = doc["paths"]["/chat"]["post"]["responses"]["200"]["content"]  # type: ignore[index]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/NativeChatResponse"}
    data = ok["text/event-stream"]["schema"]["properties"]["data"]
    assert data["contentMediaType"] == "application/json"
    refs = {item["$ref"] for item in data["contentSchema"]["anyOf"]}
    assert refs == {"#/components/schemas/NativeStreamEvent", "#/components/schemas/ErrorEnvelope"}
    assert "finish_reason" in doc["components"]["schemas"]["NativeStreamEvent"]["properties"]  # type: ignore[index]


class _Body(BaseModel):
    value: int


def test_ollama_paths_get_the_ollama_error_shape() -> None:
    app = FastAPI()

    @app.post("/api/thing")
    async def thing(body: Annotated[_Body, Depends(json_body(_Body))]) -> None:
        return None

    doc = openapi_schema(app)
    responses = doc["paths"]["/api/thing"]["post"]["responses"]
    assert responses["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OllamaError"
    }


def test_body_model_finds_the_json_body_dependency(app: FastAPI) -> None:
    found = {route.path: body_model(route.dependant) for route in api_routes(app.routes)}
    assert found["/generate"] is not None and found["/generate"].__name__ == "NativeGenerateRequest"
    assert found["/healthz"] is None
