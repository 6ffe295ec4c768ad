"""Every control applies on every frontend, from one table: a frontend added to `FRONTENDS`
gets every control's test, so none can skip one.

Controls: authentication (401), the route's scope (403), input guardrails (400
`content_filter`, nothing generated), token rate limits (429 once a key's tokens are
spent), `priority_cap` (the request runs at the cap: /debug), the tenant's prefix-cache
namespace (no cached tokens across tenants). Each answer is checked in the frontend's own
error shape. Runs on the real app over the real engine with authentication on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest

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


def _openai(body: dict) -> str:
    return str(body["error"]["code"])


def _ollama(body: dict) -> str:
    assert set(body) == {"error"} and isinstance(body["error"], str)
    return "ollama"


def _anthropic(body: dict) -> str:
    assert body["type"] == "error"
    return str(body["error"]["type"])


def _chat(model: str, text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


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
    Frontend("openai embeddings", "/v1/embeddings", lambda m, t: {"input": t}, _openai, False),
    Frontend("native embeddings", "/embeddings", lambda m, t: {"input": t}, _openai, False),
    Frontend("ollama embed", "/api/embed", lambda m, t: {"model": m, "input": t}, _ollama, False),
]
GENERATING = [f for f in FRONTENDS if f.generates]
IDS = [f.name for f in FRONTENDS]


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
    async with secured.client() as anonymous:
        refused = await anonymous.post(frontend.path, json=body)
    async with secured.client(KEYS["read"]) as reader:
        denied = await reader.post(frontend.path, json=body)
    async with secured.client(KEYS["generate"]) as user:
        allowed = await user.post(frontend.path, json=body)
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
        async with secured.client(KEYS["generate"]) as user:
            answer = await user.post(frontend.path, json=frontend.body(model, "a forbiddenword"))
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
    async with secured.client(key) as user:
        answers = [await user.post(frontend.path, json=frontend.body(model, WORDS))]
        while answers[-1].status_code == 200 and len(answers) < 8:
            answers.append(await user.post(frontend.path, json=frontend.body(model, WORDS)))
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
    async with secured.client(key) as user:
        answer = await user.post(frontend.path, json=frontend.body(model, WORDS))
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
        async with secured.client(key) as user:
            for _ in range(repeats):
                answer = await user.post(frontend.path, json=frontend.body(model, text))
                assert answer.status_code == 200, answer.text
        recent = (await admin.get("/debug/requests", params={"tenant": tenant})).json()["recent"]
        cached[side] = [r["num_cached_tokens"] for r in recent]
    assert cached["a"][0] > 0  # the second request of tenant a (newest first)
    assert cached["b"] == [0]
