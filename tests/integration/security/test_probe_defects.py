"""Regressions of the defects a black-box probe found (issue 30), on the real app over the
real engine with authentication on: each test failed on the code before its fix.

- a key's or tenant's `priority_cap` lowers a request's priority, on every route;
- a grammar beyond the engine's per-step limits is a 400 before anything is queued;
- a path with a trailing slash is served (scope checked), never redirected to a URL
  built from the client's `Host`;
- admin input that names nothing usable is a 422 naming the field, nothing stored;
- one embeddings request cannot hold every other tenant's embeddings behind it.
(Secrets in outbound URLs are the canary's: tests/integration/test_audit_canary.py.)
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.security.conftest import KEYS, SecuredApp

pytestmark = pytest.mark.model

CHAT = [{"role": "user", "content": "Say hi."}]


async def _key(admin: httpx.AsyncClient, **fields: object) -> str:
    created = await admin.post("/v1/admin/api_keys", json={"roles": ["user"], **fields})
    assert created.status_code == 201, created.text
    return str(created.json()["key"])


async def _priorities(admin: httpx.AsyncClient, tenant: str) -> list[str]:
    recent = (await admin.get("/debug/requests", params={"tenant": tenant})).json()["recent"]
    return [r["priority"] for r in recent]


async def test_a_capped_caller_runs_at_its_cap_on_every_route(secured: SecuredApp):
    async with secured.client(KEYS["admin"]) as admin:
        model = (await admin.get("/v1/models")).json()["data"][0]["id"]
    ollama = {"model": model, "stream": False, "options": {"num_predict": 2}, "priority": "high"}
    requests = [
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "priority": "high"}),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "priority": "high"}),
        ("/generate", {"prompt": "Hi", "max_tokens": 2, "priority": "high"}),
        ("/chat", {"messages": CHAT, "max_tokens": 2, "priority": "normal"}),
        ("/api/chat", {"messages": CHAT, **ollama}),
        ("/api/generate", {"prompt": "Hi", **ollama}),
    ]
    async with secured.client(KEYS["admin"]) as admin:
        assert (
            await admin.post("/v1/admin/tenants", json={"name": "probe-low"})
        ).status_code == 201
        capped = await _key(admin, tenant="probe-low", priority_cap="low")
        async with secured.client(capped) as user:
            for path, body in requests:
                answer = await user.post(path, json=body)
                assert answer.status_code == 200, (path, answer.text)
        assert await _priorities(admin, "probe-low") == ["low"] * len(requests)
        # the tenant's cap narrows a key without one
        body = {"name": "probe-normal", "priority_cap": "normal"}
        assert (await admin.post("/v1/admin/tenants", json=body)).status_code == 201
        uncapped = await _key(admin, tenant="probe-normal")
        async with secured.client(uncapped) as user:
            chat = {"messages": CHAT, "max_tokens": 2, "priority": "high"}
            assert (await user.post("/v1/chat/completions", json=chat)).status_code == 200
            chat["priority"] = "low"  # asking for less than the cap is kept
            assert (await user.post("/v1/chat/completions", json=chat)).status_code == 200
        assert await _priorities(admin, "probe-normal") == ["low", "normal"]  # newest first


@pytest.mark.parametrize(
    ("grammar", "syntax"),
    [
        ('root ::= "a"{100000}', "gbnf"),
        ("(a{1000}){1000}", "regex"),
        ('start: ("a"{1000}){1000}', "lark"),
    ],
)
async def test_a_grammar_beyond_the_engine_limits_is_refused_before_queueing(
    secured: SecuredApp, grammar: str, syntax: str
):
    body = {"messages": CHAT, "max_tokens": 4, "grammar": grammar, "grammar_syntax": syntax}
    async with secured.client(KEYS["admin"]) as admin:
        before = (await admin.get("/server/stats")).json()["workers"][0]["num_prompt_tokens_total"]
        answer = await admin.post("/v1/chat/completions", json=body)
        after = (await admin.get("/server/stats")).json()["workers"][0]["num_prompt_tokens_total"]
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "grammar" and "limits for one step" in error["message"]
    assert after == before  # nothing reached the engine


async def test_a_trailing_slash_is_served_after_the_scope_check_never_redirected(
    secured: SecuredApp,
):
    evil = {"host": "evil.example.com"}
    async with secured.client(KEYS["generate"], **evil) as user:
        for path in ("/v1/admin/api_keys/", "/debug/requests/", "/v1/admin/api_keys///"):
            answer = await user.get(path)
            assert answer.status_code == 403, (path, answer.status_code)
            assert "location" not in answer.headers
        models = await user.get("/v1/models/")
        assert models.status_code == 403  # the generate key lacks `read`, as without the slash
    async with secured.client(KEYS["admin"], **evil) as admin:
        listed = await admin.get("/v1/admin/api_keys/")
        assert listed.status_code == 200 and listed.json()["object"] == "list"
        assert (await admin.get("/v1/models/")).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/admin/api_keys", {"name": "ci\r\nforged", "scopes": ["read"]}, "name"),
        ("/v1/admin/api_keys", {"name": "nul\x00", "scopes": ["read"]}, "name"),
        ("/v1/admin/api_keys", {"scopes": ["read"], "tenant": "nobody"}, "tenant"),
        (
            "/v1/admin/api_keys",
            {"scopes": ["read"], "rate_limit_tier": "no-such-tier"},
            "rate_limit_tier",
        ),
        (
            "/v1/admin/api_keys",
            {"scopes": ["read"], "allowed_models": ["../x"]},
            "allowed_models[0]",
        ),
        (
            "/v1/admin/tenants",
            {"name": "t1", "allowed_models": ["ok", "a/../b"]},
            "allowed_models[1]",
        ),
    ],
)
async def test_admin_input_that_names_nothing_usable_is_a_422(
    secured: SecuredApp, path: str, body: dict, param: str
):
    async with secured.client(KEYS["admin"]) as admin:
        keys_before = (await admin.get("/v1/admin/api_keys")).json()["data"]
        answer = await admin.post(path, json=body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["param"] == param
        assert (await admin.get("/v1/admin/api_keys")).json()["data"] == keys_before
        assert (await admin.get("/v1/admin/tenants/t1")).status_code == 404


@pytest.mark.parametrize(
    "pattern", ["(a)\\1", "a(?=b)", "(?<!x)y", "a\\Z", "(?P<n>a)(?P=n)", "(?x) a b", "a{1001}"]
)
async def test_a_pattern_the_guardrails_cannot_run_is_a_422_and_changes_nothing(
    secured: SecuredApp, pattern: str
):
    async with secured.client(KEYS["admin"]) as admin:
        before = (await admin.get("/v1/admin/guardrails")).json()
        answer = await admin.put("/v1/admin/guardrails", json={"blocklist_regex": ["ok", pattern]})
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["param"] == "blocklist_regex[1]"
        assert (await admin.get("/v1/admin/guardrails")).json() == before
        chat = {"messages": CHAT, "max_tokens": 2}
        assert (await admin.post("/v1/chat/completions", json=chat)).status_code == 200


async def test_a_small_embeddings_request_is_not_held_behind_a_large_one(secured: SecuredApp):
    """One tenant's many inputs used to run first come first served, so another tenant's
    single input waited for all of them; now it takes its share of the sequences and
    finishes while the large request is still running. (64 inputs of about 70 tokens:
    about 9 forward passes of 512 tokens, where the small one needs 1 or 2.)"""
    text = "The quarterly report describes revenue, costs and the outlook. " * 6
    async with secured.client(KEYS["admin"]) as admin:
        large = asyncio.create_task(admin.post("/v1/embeddings", json={"input": [text] * 64}))
        await asyncio.sleep(0.5)  # the large one is queued and running
        assert not large.done()
        async with secured.client(KEYS["globex"]) as other:
            small = await other.post("/v1/embeddings", json={"input": ["Hello there."]})
        still_running = not large.done()
        assert (await large).status_code == 200
    assert small.status_code == 200 and len(small.json()["data"]) == 1
    assert still_running
