"""Every control applies on every frontend, from one table: a frontend added to `FRONTENDS`
gets every control's test, so none can skip one.

Controls: authentication (401), the route's scope (403), input guardrails (400
`content_filter`, nothing generated), token rate limits (429 once a key's tokens are
spent), `priority_cap` (the request runs at the cap: /debug), the tenant's prefix-cache
namespace (no cached tokens across tenants). Each answer is checked in the frontend's own
error shape (gRPC: its status, read back as the HTTP status it stands for, and the
`inferflux-error-code` trailer). Runs on the real app over the real engine with
authentication on (its lifespan serves gRPC on `server.grpc_port`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import httpx
import pytest
from starlette.types import ASGIApp, Message

from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.grpc.gen import inference_pb2_grpc as pb_grpc
from inferflux.api.state import app_state
from tests.integration.security.conftest import KEYS, SecuredApp

pytestmark = pytest.mark.model

WORDS = "Tell me about the sea and the ships that sail on it every single day."


@dataclass(frozen=True)
class Frontend:
    name: str
    path: str
    body: Callable[[str, str], dict]  # (model, text) → a valid body
    error: Callable[[dict], str]  # an error body → its code or type, in this shape
    generates: bool = True
    websocket: bool = False  # the body goes as a `response.create` message on a WebSocket
    grpc: bool = False  # `path` names an inferflux.v1 method; the body is its request message


def _openai(body: dict) -> str:
    return str(body["error"]["code"])


def _ollama(body: dict) -> str:
    assert set(body) == {"error"} and isinstance(body["error"], str)
    return "ollama"


def _anthropic(body: dict) -> str:
    assert body["type"] == "error"
    return str(body["error"]["type"])


def _grpc(body: dict) -> str:
    return str(body["error"]["code"])  # the `inferflux-error-code` trailer


def _chat(model: str, text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


_GRPC_SAMPLING = pb.Sampling(max_tokens=2, priority=pb.PRIORITY_HIGH)


FRONTENDS = [
    Frontend(
        "openai chat",
        "/v1/chat/completions",
        lambda m, t: {"model": m, "messages": _chat(m, t), "max_tokens": 2, "priority": "high"},
        _openai,
    ),
    Frontend(
        "openai completions",
        "/v1/completions",
        lambda m, t: {"model": m, "prompt": t, "max_tokens": 2, "priority": "high"},
        _openai,
    ),
    Frontend(
        "native generate",
        "/generate",
        lambda m, t: {"prompt": t, "max_tokens": 2, "priority": "high"},
        _openai,
    ),
    Frontend(
        "native chat",
        "/chat",
        lambda m, t: {"messages": _chat(m, t), "max_tokens": 2, "priority": "high"},
        _openai,
    ),
    Frontend(
        "ollama chat",
        "/api/chat",
        lambda m, t: {
            "model": m,
            "messages": _chat(m, t),
            "stream": False,
            "options": {"num_predict": 2},
            "priority": "high",
        },
        _ollama,
    ),
    Frontend(
        "ollama generate",
        "/api/generate",
        lambda m, t: {
            "model": m,
            "prompt": t,
            "stream": False,
            "options": {"num_predict": 2},
            "priority": "high",
        },
        _ollama,
    ),
    Frontend(
        "anthropic messages",
        "/v1/messages",
        lambda m, t: {"model": m, "messages": _chat(m, t), "max_tokens": 2, "priority": "high"},
        _anthropic,
    ),
    Frontend(
        "openai responses",
        "/v1/responses",
        lambda m, t: {"model": m, "input": t, "max_output_tokens": 2, "priority": "high"},
        _openai,
    ),
    Frontend(
        "openai responses websocket",
        "/v1/responses",
        lambda m, t: {"model": m, "input": t, "max_output_tokens": 2, "priority": "high"},
        _openai,
        websocket=True,
    ),
    Frontend(
        "grpc chat",
        "Chat",
        lambda m, t: pb.ChatRequest(
            model=m, messages=[pb.ChatMessage(role="user", content=t)], sampling=_GRPC_SAMPLING
        ),
        _grpc,
        grpc=True,
    ),
    Frontend(
        "grpc generate",
        "Generate",
        lambda m, t: pb.GenerateRequest(model=m, prompt=t, sampling=_GRPC_SAMPLING),
        _grpc,
        grpc=True,
    ),
    Frontend(
        "lmstudio chat",
        "/api/v0/chat/completions",
        lambda m, t: {"model": m, "messages": _chat(m, t), "max_tokens": 2, "priority": "high"},
        _openai,
    ),
    Frontend(
        "lmstudio completions",
        "/api/v0/completions",
        lambda m, t: {"model": m, "prompt": t, "max_tokens": 2, "priority": "high"},
        _openai,
    ),
    Frontend("openai embeddings", "/v1/embeddings", lambda m, t: {"input": t}, _openai, False),
    Frontend(
        "lmstudio embeddings", "/api/v0/embeddings", lambda m, t: {"input": t}, _openai, False
    ),
    Frontend("native embeddings", "/embeddings", lambda m, t: {"input": t}, _openai, False),
    Frontend("ollama embed", "/api/embed", lambda m, t: {"model": m, "input": t}, _ollama, False),
    Frontend(
        "grpc embed",
        "Embed",
        lambda m, t: pb.EmbedRequest(model=m, inputs=[t]),
        _grpc,
        False,
        grpc=True,
    ),
]
GENERATING = [f for f in FRONTENDS if f.generates]
IDS = [f.name for f in FRONTENDS]
_ENDED = ("response.completed", "response.incomplete", "response.failed", "error")


@dataclass
class Answer:
    """What a WebSocket exchange ended with, read like an HTTP response."""

    status_code: int
    body: dict = field(default_factory=dict)

    def json(self) -> dict:
        return self.body

    @property
    def text(self) -> str:
        return json.dumps(self.body)


async def _post(
    secured: SecuredApp, frontend: Frontend, key: str | None, body: dict
) -> httpx.Response | Answer:
    if frontend.websocket:
        return await _over_websocket(secured.app, key, frontend.path, body)
    if frontend.grpc:
        return await _over_grpc(secured.app, key, frontend.path, body)
    async with secured.client(key) as client:
        return await client.post(frontend.path, json=body)


async def _over_websocket(app: ASGIApp, key: str | None, path: str, body: dict) -> Answer:
    """One `response.create` over an in-process WebSocket: a refused handshake (its HTTP
    status, or a close: 403), an `error` event (its status), or the finished response."""
    headers = [(b"host", b"inferflux")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "scheme": "ws",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("inferflux", 80),
        "subprotocols": [],
        "extensions": {"websocket.http.response": {}},
        "state": {},
    }
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    inbox.put_nowait({"type": "websocket.connect"})
    task = asyncio.create_task(app(scope, inbox.get, outbox.put))
    try:
        first = await asyncio.wait_for(outbox.get(), 30)
        if first["type"] == "websocket.http.response.start":
            refused = await outbox.get()
            return Answer(first["status"], json.loads(refused["body"]))
        if first["type"] == "websocket.close":
            return Answer(403, {"error": {"code": "insufficient_scope"}})
        assert first["type"] == "websocket.accept", first
        message = json.dumps({"type": "response.create", **body})
        inbox.put_nowait({"type": "websocket.receive", "text": message})
        while (event := json.loads((await asyncio.wait_for(outbox.get(), 60))["text"]))[
            "type"
        ] not in _ENDED:
            pass
        if event["type"] == "error":
            return Answer(event["status"], {"error": event["error"]})
        return Answer(200, event["response"])
    finally:
        inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(task, 30)


# the HTTP status each gRPC status stands for (api/grpc/bridge.py maps the other way)
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
}


async def _over_grpc(app: ASGIApp, key: str | None, method: str, message) -> Answer:
    """One call with the generated client on the app's gRPC port, read to its end."""
    port = app_state(app).settings.server.grpc_port
    metadata = () if key is None else (("authorization", f"Bearer {key}"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        rpc = getattr(pb_grpc.InferenceStub(channel), method)
        try:
            if method == "Embed":
                await rpc(message, metadata=metadata, timeout=60)
            else:
                async for _ in rpc(message, metadata=metadata, timeout=60):
                    pass
        except grpc.aio.AioRpcError as error:
            trailers = dict(error.trailing_metadata() or ())
            code = trailers.get("inferflux-error-code")
            body = {"error": {"code": code, "message": error.details()}}
            return Answer(_HTTP_STATUS.get(error.code(), 500), body)
    return Answer(200)


@pytest.fixture
async def model(secured: SecuredApp) -> str:
    async with secured.client(KEYS["admin"]) as admin:
        return str((await admin.get("/v1/models")).json()["data"][0]["id"])


@pytest.fixture
async def admin(secured: SecuredApp) -> AsyncIterator[httpx.AsyncClient]:
    async with secured.client(KEYS["admin"]) as client:
        yield client


async def _key(admin: httpx.AsyncClient, tenant: str, **fields: object) -> str:
    if tenant != "default" and (await admin.get(f"/v1/admin/tenants/{tenant}")).status_code == 404:
        assert (await admin.post("/v1/admin/tenants", json={"name": tenant})).status_code == 201
    body = {"roles": ["user"], "tenant": tenant, **fields}
    created = await admin.post("/v1/admin/api_keys", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["key"])


@pytest.mark.parametrize("frontend", FRONTENDS, ids=IDS)
async def test_authentication_and_scope(secured: SecuredApp, frontend: Frontend, model: str):
    body = frontend.body(model, WORDS)
    refused = await _post(secured, frontend, None, body)
    denied = await _post(secured, frontend, KEYS["read"], body)
    allowed = await _post(secured, frontend, KEYS["generate"], body)
    assert refused.status_code == 401 and frontend.error(refused.json())
    assert denied.status_code == 403 and frontend.error(denied.json())
    assert allowed.status_code == 200, allowed.text


@pytest.mark.parametrize("frontend", FRONTENDS, ids=IDS)
async def test_input_guardrails(
    secured: SecuredApp, frontend: Frontend, model: str, admin: httpx.AsyncClient
):
    before = (await admin.get("/v1/admin/guardrails")).json()
    blocked = {**before, "blocklist": [*before["blocklist"], "forbiddenword"]}
    assert (await admin.put("/v1/admin/guardrails", json=blocked)).status_code == 200
    try:
        body = frontend.body(model, "a forbiddenword")
        answer = await _post(secured, frontend, KEYS["generate"], body)
    finally:
        assert (await admin.put("/v1/admin/guardrails", json=before)).status_code == 200
    assert answer.status_code == 400, answer.text
    code = frontend.error(answer.json())
    assert code in ("content_filter", "invalid_request_error", "ollama")


@pytest.mark.parametrize("frontend", FRONTENDS, ids=IDS)
async def test_token_rate_limits(
    secured: SecuredApp, frontend: Frontend, model: str, admin: httpx.AsyncClient
):
    key = await _key(admin, "default", limits={"tokens_per_minute": 80})
    answers = [await _post(secured, frontend, key, frontend.body(model, WORDS))]
    while answers[-1].status_code == 200 and len(answers) < 8:
        answers.append(await _post(secured, frontend, key, frontend.body(model, WORDS)))
    assert answers[0].status_code == 200, answers[0].text
    refused = answers[-1]
    assert refused.status_code == 429, [a.status_code for a in answers]
    assert frontend.error(refused.json()) in ("rate_limit_exceeded", "rate_limit_error", "ollama")


@pytest.mark.parametrize("frontend", GENERATING, ids=[f.name for f in GENERATING])
async def test_priority_cap(
    secured: SecuredApp, frontend: Frontend, model: str, admin: httpx.AsyncClient
):
    tenant = "cap-" + frontend.name.replace(" ", "-")
    key = await _key(admin, tenant, priority_cap="low")
    answer = await _post(secured, frontend, key, frontend.body(model, WORDS))
    assert answer.status_code == 200, answer.text
    recent = (await admin.get("/debug/requests", params={"tenant": tenant})).json()["recent"]
    assert [r["priority"] for r in recent] == ["low"]


@pytest.mark.parametrize("frontend", GENERATING, ids=[f.name for f in GENERATING])
async def test_tenants_never_share_cached_prefixes(
    secured: SecuredApp, frontend: Frontend, model: str, admin: httpx.AsyncClient
):
    """The same long prompt twice in one tenant reuses its KV; in another tenant it is
    computed again (the cache is namespaced by tenant)."""
    text = f"{frontend.name}: " + WORDS * 6
    cached: dict[str, list[int]] = {}
    for side, repeats in (("a", 2), ("b", 1)):
        tenant = f"cache-{side}-{frontend.name.replace(' ', '-')}"
        key = await _key(admin, tenant)
        for _ in range(repeats):
            answer = await _post(secured, frontend, key, frontend.body(model, text))
            assert answer.status_code == 200, answer.text
        recent = (await admin.get("/debug/requests", params={"tenant": tenant})).json()["recent"]
        cached[side] = [r["num_cached_tokens"] for r in recent]
    assert cached["a"][0] > 0  # the second request of tenant a (newest first)
    assert cached["b"] == [0]


async def test_stored_responses_are_invisible_to_other_tenants(secured: SecuredApp, model: str):
    """A response kept for previous_response_id belongs to its tenant: another tenant can
    neither read, list, delete nor continue it (404 / 400, as if it did not exist)."""
    body = {"model": model, "input": WORDS, "max_output_tokens": 2}
    async with secured.client(KEYS["generate"]) as acme, secured.client(KEYS["globex"]) as globex:
        created = await acme.post("/v1/responses", json=body)
        assert created.status_code == 200, created.text
        response_id = created.json()["id"]
        for path in (f"/v1/responses/{response_id}", f"/v1/responses/{response_id}/input_items"):
            assert (await globex.get(path)).status_code == 404
        assert (await globex.delete(f"/v1/responses/{response_id}")).status_code == 404
        chained = await globex.post(
            "/v1/responses", json={**body, "previous_response_id": response_id}
        )
        assert chained.status_code == 400
        assert chained.json()["error"]["code"] == "previous_response_not_found"
        assert (await acme.get(f"/v1/responses/{response_id}")).status_code == 200
