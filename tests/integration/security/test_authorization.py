"""Authentication and RBAC on the real app (SmolLM2): every route × every kind of caller,
401/403 bodies, credentials in the URL, model rights, tenants in /debug."""

from __future__ import annotations

import pytest
from fastapi.routing import iter_route_contexts

from inferflux.api.state import app_state
from inferflux.security.principal import Scope
from tests.integration.security.conftest import KEYS, SecuredApp

pytestmark = pytest.mark.model

PUBLIC = {"/healthz", "/livez", "/readyz", "/metrics"}
CHAT = [{"role": "user", "content": "Hi"}]
GRPC = "/grpc/inferflux.v1.Inference"
ANY = "any valid credential"  # a route that needs authentication and no scope


def requests_by_route(
    model: str,
) -> dict[tuple[str, str], tuple[str, dict | None, Scope | str | None]]:
    """(method, route path) → (URL, JSON body, scope needed). Admin calls are harmless:
    bad bodies (400) or unknown ids (404) once past authorization."""
    gen, read, admin = Scope.GENERATE, Scope.READ, Scope.ADMIN
    short = {"max_tokens": 1}
    table = {
        ("GET", "/healthz"): ("/healthz", None, None),
        ("GET", "/livez"): ("/livez", None, None),
        ("GET", "/readyz"): ("/readyz", None, None),
        ("GET", "/metrics"): ("/metrics", None, None),
        ("GET", "/server/stats"): ("/server/stats", None, read),
        ("GET", "/debug/requests"): ("/debug/requests", None, admin),
        ("GET", "/debug/requests/{request_id}"): ("/debug/requests/none", None, admin),
        ("GET", "/v1/models"): ("/v1/models", None, read),
        ("GET", "/v1/models/{model_id}"): (f"/v1/models/{model}", None, read),
        ("POST", "/v1/chat/completions"): (
            "/v1/chat/completions",
            {"messages": CHAT, **short},
            gen,
        ),
        ("POST", "/v1/completions"): ("/v1/completions", {"prompt": "Hi", **short}, gen),
        ("POST", "/v1/embeddings"): ("/v1/embeddings", {"input": "Hi"}, gen),
        ("POST", "/tokenize"): ("/tokenize", {"prompt": "Hi"}, gen),
        ("POST", "/detokenize"): ("/detokenize", {"tokens": [1]}, gen),
        ("POST", "/generate"): ("/generate", {"prompt": "Hi", **short}, gen),
        ("POST", "/chat"): ("/chat", {"messages": CHAT, **short}, gen),
        ("POST", "/embeddings"): ("/embeddings", {"input": "Hi"}, gen),
        ("POST", "/v1/messages"): (
            "/v1/messages",
            {"model": model, "messages": CHAT, **short},
            gen,
        ),
        ("POST", "/v1/messages/count_tokens"): (
            "/v1/messages/count_tokens",
            {"model": model, "messages": CHAT},
            gen,
        ),
        ("POST", "/v1/responses"): (
            "/v1/responses",
            {"model": model, "input": "Hi", "max_output_tokens": 1},
            gen,
        ),
        ("POST", "/v1/responses/input_tokens"): (
            "/v1/responses/input_tokens",
            {"model": model, "input": "Hi"},
            gen,
        ),
        ("GET", "/v1/responses/{response_id}"): ("/v1/responses/resp_none", None, gen),
        ("DELETE", "/v1/responses/{response_id}"): ("/v1/responses/resp_none", None, gen),
        ("GET", "/v1/responses/{response_id}/input_items"): (
            "/v1/responses/resp_none/input_items",
            None,
            gen,
        ),
        ("POST", "/api/generate"): ("/api/generate", _ollama(model, prompt="Hi"), gen),
        ("POST", "/api/chat"): ("/api/chat", _ollama(model, messages=CHAT), gen),
        ("POST", "/api/embed"): ("/api/embed", {"model": model, "input": "Hi"}, gen),
        ("POST", "/api/embeddings"): ("/api/embeddings", {"model": model, "prompt": "Hi"}, gen),
        ("GET", "/api/tags"): ("/api/tags", None, read),
        ("POST", "/api/show"): ("/api/show", {"model": model}, read),
        ("GET", "/api/ps"): ("/api/ps", None, read),
        ("GET", "/api/version"): ("/api/version", None, read),
        ("POST", "/api/pull"): ("/api/pull", {"model": "no-such-model"}, admin),
        ("GET", "/"): ("/", None, read),
        ("DELETE", "/api/delete"): ("/api/delete", {"model": "none"}, admin),
        ("POST", "/api/copy"): ("/api/copy", {"source": "none", "destination": "x"}, admin),
        ("POST", "/api/create"): ("/api/create", {}, admin),
        ("POST", "/api/blobs/{digest}"): ("/api/blobs/sha256:none", None, admin),
        ("GET", "/api/v0/models"): ("/api/v0/models", None, read),
        ("GET", "/api/v0/models/{model_id}"): (f"/api/v0/models/{model}", None, read),
        ("POST", "/api/v0/chat/completions"): (
            "/api/v0/chat/completions",
            {"messages": CHAT, **short},
            gen,
        ),
        ("POST", "/api/v0/completions"): ("/api/v0/completions", {"prompt": "Hi", **short}, gen),
        ("POST", "/api/v0/embeddings"): ("/api/v0/embeddings", {"input": "Hi"}, gen),
        ("GET", "/openapi.json"): ("/openapi.json", None, read),
        ("GET", "/docs"): ("/docs", None, read),
        ("GET", "/docs/oauth2-redirect"): ("/docs/oauth2-redirect", None, read),
        ("GET", "/redoc"): ("/redoc", None, read),
        ("GET", "/v1/admin/api_keys"): ("/v1/admin/api_keys", None, admin),
        ("POST", "/v1/admin/api_keys"): ("/v1/admin/api_keys", {}, admin),
        ("GET", "/v1/admin/api_keys/{key_id}"): ("/v1/admin/api_keys/none", None, admin),
        ("DELETE", "/v1/admin/api_keys/{key_id}"): ("/v1/admin/api_keys/none", None, admin),
        ("POST", "/v1/admin/api_keys/{key_id}/rotate"): (
            "/v1/admin/api_keys/none/rotate",
            None,
            admin,
        ),
        ("GET", "/v1/admin/tenants"): ("/v1/admin/tenants", None, admin),
        ("POST", "/v1/admin/tenants"): ("/v1/admin/tenants", {}, admin),
        ("GET", "/v1/admin/tenants/{name}"): ("/v1/admin/tenants/none", None, admin),
        ("PUT", "/v1/admin/tenants/{name}"): ("/v1/admin/tenants/none", {}, admin),
        ("DELETE", "/v1/admin/tenants/{name}"): ("/v1/admin/tenants/none", None, admin),
        ("GET", "/v1/admin/rate_limit"): ("/v1/admin/rate_limit", None, admin),
        ("PUT", "/v1/admin/rate_limit"): ("/v1/admin/rate_limit", {"bogus": 1}, admin),
        ("GET", "/v1/admin/guardrails"): ("/v1/admin/guardrails", None, admin),
        ("PUT", "/v1/admin/guardrails"): ("/v1/admin/guardrails", {"pii_action": "?"}, admin),
        ("GET", "/v1/admin/config"): ("/v1/admin/config", None, admin),
        ("PATCH", "/v1/admin/config"): ("/v1/admin/config", {"bogus": 1}, admin),
        ("GET", "/v1/admin/models"): ("/v1/admin/models", None, admin),
        ("POST", "/v1/admin/models"): ("/v1/admin/models", {}, admin),
        ("GET", "/v1/admin/workers"): ("/v1/admin/workers", None, admin),
        ("POST", "/v1/admin/workers"): ("/v1/admin/workers", {}, admin),
        ("GET", "/v1/admin/adapters"): ("/v1/admin/adapters", None, Scope.ADAPTER_MANAGER),
        ("POST", "/v1/admin/adapters"): ("/v1/admin/adapters", {}, Scope.ADAPTER_MANAGER),
        # the gRPC bridge's routes: 404 over HTTP once past authorization
        **{
            ("POST", f"{GRPC}/{method}"): (f"{GRPC}/{method}", None, gen)
            for method in ("Generate", "Chat", "Embed")
        },
        ("POST", f"{GRPC}/ListModels"): (f"{GRPC}/ListModels", None, read),
        ("GET", "/v1/admin/usage"): ("/v1/admin/usage", None, admin),
        # the web console: its page, files and sign-in are public; who-am-I and sign-out
        # need a valid credential and no scope
        ("GET", "/ui"): ("/ui", None, None),
        ("GET", "/ui/static/{name}"): ("/ui/static/app.js", None, None),
        ("POST", "/ui/session"): ("/ui/session", {}, None),
        ("GET", "/ui/session"): ("/ui/session", None, ANY),
        ("DELETE", "/ui/session"): ("/ui/session", None, ANY),
    }
    return table


def _ollama(model: str, **body) -> dict:
    return {"model": model, "stream": False, "options": {"num_predict": 1}, **body}


def app_routes(secured: SecuredApp) -> set[tuple[str, str]]:
    found = set()
    for route in iter_route_contexts(secured.app.routes):
        for method in route.methods or ():
            if method != "HEAD":
                found.add((method, route.path.replace("{model_id:path}", "{model_id}")))
    return found


def model_id(secured: SecuredApp) -> str:
    return app_state(secured.app).models.default_serving().model_info.model_id


def test_the_matrix_covers_every_route(secured: SecuredApp):
    assert app_routes(secured) == set(requests_by_route(model_id(secured)))


CALLERS = {
    # name: (credential, scopes held; None = not authenticated)
    "admin": (KEYS["admin"], set(Scope)),
    "read-only": (KEYS["read"], {Scope.READ}),
    "generate-only": (KEYS["generate"], {Scope.GENERATE}),
    "adapter-manager": (KEYS["adapter"], {Scope.ADAPTER_MANAGER}),
    "no key": (None, None),
    "unknown key": ("sk-inf-not-a-key-at-all-000000", None),
    "revoked key": ("<revoked>", None),
}


@pytest.mark.parametrize("caller", list(CALLERS))
async def test_route_by_caller_matrix(secured: SecuredApp, caller: str):
    key, scopes = CALLERS[caller]
    key = secured.revoked_key if key == "<revoked>" else key
    problems = []
    async with secured.client(key) as client:
        for (method, _), (url, body, needed) in requests_by_route(model_id(secured)).items():
            response = await client.request(method, url, json=body)
            status = response.status_code
            if needed is None or (scopes is not None and (needed == ANY or needed in scopes)):
                ok = status not in (401, 403) and status < 500
            elif scopes is None:
                ok = status == 401 and response.headers["www-authenticate"].startswith("Bearer")
            else:
                ok = status == 403
            if not ok:
                problems.append(f"{method} {url}: {status} {response.text[:120]}")
            if key:
                assert key not in response.text
    assert problems == []


async def test_refusals_use_the_api_shape_of_the_path(secured: SecuredApp):
    async with secured.client("sk-inf-wrong-key-1234567890") as client:
        openai = await client.get("/v1/models")
        ollama = await client.get("/api/tags")
    assert openai.status_code == ollama.status_code == 401
    assert openai.json() == {
        "error": {
            "message": "invalid, expired or revoked API key",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert ollama.json() == {"error": "invalid, expired or revoked API key"}
    async with secured.client(KEYS["read"]) as client:
        denied = await client.post("/v1/completions", json={"prompt": "Hi"})
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "insufficient_scope"
    assert "'reader' lacks the 'generate' scope" in denied.json()["error"]["message"]


async def test_x_api_key_works_and_two_different_credentials_do_not(secured: SecuredApp):
    async with secured.client(None, **{"x-api-key": KEYS["read"]}) as client:
        assert (await client.get("/v1/models")).status_code == 200
    mixed = {"x-api-key": KEYS["admin"]}
    async with secured.client(KEYS["read"], **mixed) as client:
        response = await client.get("/v1/models")
    assert response.status_code == 401 and "send one credential" in response.text
    async with secured.client(None, authorization=f"Basic {KEYS['read']}") as client:
        assert (await client.get("/v1/models")).status_code == 401


@pytest.mark.parametrize("param", ["api_key", "key", "access_token", "API_KEY"])
async def test_credentials_in_the_url_are_refused(secured: SecuredApp, param: str):
    async with secured.client(None) as client:
        alone = await client.get("/v1/models", params={param: KEYS["admin"]})
    async with secured.client(KEYS["read"]) as client:
        with_header = await client.get("/v1/models", params={param: KEYS["admin"]})
    for response in (alone, with_header):
        assert response.status_code == 401
        assert "credentials in the URL are refused" in response.text
        assert KEYS["admin"] not in response.text


async def test_public_probes_need_no_key_and_ignore_a_bad_one(secured: SecuredApp):
    for key in (None, "sk-inf-garbage-000000000000"):
        async with secured.client(key) as client:
            for path in sorted(PUBLIC):
                assert (await client.get(path)).status_code == 200, path
    async with secured.client(None) as client:
        # deny by default: an unknown path is 401, not a 404 that maps the routes
        assert (await client.get("/no/such/route")).status_code == 401
        assert (await client.get("/healthz/")).status_code == 401


async def test_a_model_outside_allowed_models_is_forbidden(secured: SecuredApp):
    model = model_id(secured)
    async with secured.client(KEYS["other_model"]) as client:
        chat = await client.post("/v1/chat/completions", json={"messages": CHAT})
        named = await client.post("/v1/completions", json={"model": model, "prompt": "Hi"})
        ollama = await client.post("/api/chat", json=_ollama(model, messages=CHAT))
        listed = await client.get("/v1/models")
        tags = await client.get("/api/tags")
        card = await client.get(f"/v1/models/{model}")
    for response in (chat, named, card):
        assert response.status_code == 403
        assert response.json()["error"]["param"] == "model"
    assert ollama.status_code == 403 and "may not use the model" in ollama.json()["error"]
    assert listed.json()["data"] == [] and tags.json() == {"models": []}


async def test_debug_shows_each_request_tenant_to_admins_only(secured: SecuredApp):
    async with secured.client(KEYS["globex"]) as client:
        done = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
        assert done.status_code == 200
        assert (await client.get("/debug/requests")).status_code == 403
        assert (await client.get(f"/debug/requests/{done.json()['id']}")).status_code == 403
    async with secured.client(KEYS["admin"]) as client:
        everything = (await client.get("/debug/requests")).json()
        acme = (await client.get("/debug/requests", params={"tenant": "acme"})).json()
        one = (await client.get(f"/debug/requests/{done.json()['id']}")).json()
    assert one["tenant"] == "globex"
    assert done.json()["id"] in {r["request_id"] for r in everything["recent"]}
    assert all(r["tenant"] == "acme" for r in acme["recent"] + acme["active"])
    assert done.json()["id"] not in {r["request_id"] for r in acme["recent"]}
