"""The web console's server side over the fake engine: its page and files with their
security headers, sign-in to a cookie session, the cookie as a credential equal to the
key (scopes, revocation), CSRF refusal, sign-out, the console turned off, and the usage
endpoint its Usage page reads."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from inferflux.api import create_app
from inferflux.api.state import app_state
from inferflux.config.settings import Settings
from inferflux.security.sessions import COOKIE_NAME
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info

ADMIN_KEY = "sk-test-console-admin-0123456789"
GENERATE_KEY = "sk-test-console-generate-0123456789"
KEYS = [
    {"key": ADMIN_KEY, "id": "ops", "roles": ["admin"]},
    {"key": GENERATE_KEY, "id": "app", "scopes": ["generate"]},
]


def build(config: dict) -> object:
    settings = Settings.model_validate(config)
    return create_app(
        settings, engine=FakeEngineClient(), tokenizer=FakeTokenizer(), model_info=fake_model_info()
    )


@pytest.fixture
async def console() -> AsyncIterator[tuple[object, httpx.AsyncClient]]:
    app = build({"auth": {"api_keys": KEYS}})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield app, client


async def sign_in(client: httpx.AsyncClient, key: str) -> str:
    answer = await client.post("/ui/session", json={"api_key": key})
    assert answer.status_code == 200, answer.text
    return answer.json()["csrf_token"]


async def test_the_page_and_its_files_carry_a_strict_csp(console):
    _, client = console
    page = await client.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert 'src="/ui/static/app.js"' in page.text and "<script>" not in page.text
    script = await client.get("/ui/static/app.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    for missing in ("/ui/static/nope.js", "/ui/static/..%2Fpages.py", "/ui/static/index.html"):
        answer = await client.get(missing)
        assert answer.status_code == 404, missing
        assert answer.json()["error"]["type"]


async def test_no_static_file_writes_html_from_strings():
    from inferflux.api.console.pages import static_files

    for name, (data, _) in static_files().items():
        text = data.decode()
        assert "innerHTML" not in text and "outerHTML" not in text, name
        assert "insertAdjacentHTML" not in text and "document.write" not in text, name
        assert "localStorage" not in text and "sessionStorage" not in text, name


async def test_sign_in_sets_an_httponly_strict_cookie_and_never_echoes_the_key(console):
    app, client = console
    assert (await client.get("/ui/session")).status_code == 401
    answer = await client.post("/ui/session", json={"api_key": ADMIN_KEY})
    assert answer.status_code == 200
    assert ADMIN_KEY not in answer.text
    body = answer.json()
    assert body["subject"] == "ops" and "admin" in body["scopes"] and body["csrf_token"]
    cookie = answer.headers["set-cookie"].lower()
    assert cookie.startswith(f"{COOKIE_NAME}=")
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    assert "secure" not in cookie  # no TLS here
    assert ADMIN_KEY not in cookie
    assert answer.headers["cache-control"] == "no-store"
    again = await client.get("/ui/session")
    assert again.status_code == 200
    assert again.json()["csrf_token"] == body["csrf_token"]
    assert len(app_state(app).security.sessions.store) == 1


async def test_bad_sign_ins_are_openai_shaped_errors(console):
    _, client = console
    wrong = await client.post("/ui/session", json={"api_key": "sk-wrong-0123456789"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert COOKIE_NAME not in wrong.headers.get("set-cookie", "")
    for body in ({}, {"api_key": ADMIN_KEY, "token": "x"}, {"password": "x"}):
        answer = await client.post("/ui/session", json=body)
        assert answer.status_code == 400, body
        assert answer.json()["error"]["type"] == "invalid_request_error"


async def test_the_cookie_acts_as_the_key_with_its_scopes(console):
    _, client = console
    await sign_in(client, GENERATE_KEY)
    assert (await client.get("/v1/models")).status_code == 403  # generate has no read
    assert (await client.get("/debug/requests")).status_code == 403
    await sign_in(client, ADMIN_KEY)  # the new cookie replaces the old one
    assert (await client.get("/v1/admin/api_keys")).status_code == 200
    assert (await client.get("/debug/requests")).status_code == 200


async def test_a_header_credential_wins_over_the_cookie(console):
    _, client = console
    await sign_in(client, ADMIN_KEY)
    headers = {"authorization": f"Bearer {GENERATE_KEY}"}
    assert (await client.get("/v1/admin/api_keys", headers=headers)).status_code == 403


async def test_state_changing_calls_need_the_csrf_header(console, caplog):
    _, client = console
    csrf = await sign_in(client, ADMIN_KEY)
    body = {"scopes": ["read"], "name": "forged"}
    for headers in ({}, {"x-csrf-token": "forged"}, {"x-csrf-token": csrf + "x"}):
        forged = await client.post("/v1/admin/api_keys", json=body, headers=headers)
        assert forged.status_code == 403, headers
        assert forged.json()["error"]["code"] == "csrf_token_invalid"
    with caplog.at_level(logging.INFO, logger="inferflux.api.admin.changes"):
        created = await client.post("/v1/admin/api_keys", json=body, headers={"x-csrf-token": csrf})
    assert created.status_code == 201
    # audited with the actor of the key that signed in, as a header call would be
    assert f"admin change by api_key:ops: api_key.create:{created.json()['id']}" in caplog.text
    listed = (await client.get("/v1/admin/api_keys")).json()["data"]
    assert [k["name"] for k in listed].count("forged") == 1  # only the one with the token


async def test_revoking_the_key_ends_its_sessions(console):
    _, client = console
    csrf = await sign_in(client, ADMIN_KEY)
    created = await client.post(
        "/v1/admin/api_keys", json={"roles": ["admin"]}, headers={"x-csrf-token": csrf}
    )
    new_key, new_id = created.json()["key"], created.json()["id"]
    transport = client._transport
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as other:
        await sign_in(other, new_key)
        assert (await other.get("/v1/admin/api_keys")).status_code == 200
        revoked = await client.delete(
            f"/v1/admin/api_keys/{new_id}", headers={"x-csrf-token": csrf}
        )
        assert revoked.status_code == 200
        gone = await other.get("/v1/admin/api_keys")
        assert gone.status_code == 401
        assert "revoked" in gone.json()["error"]["message"]


async def test_sign_out_needs_csrf_and_ends_the_session(console):
    _, client = console
    csrf = await sign_in(client, ADMIN_KEY)
    cookie = client.cookies[COOKIE_NAME]
    assert (await client.delete("/ui/session")).status_code == 403
    out = await client.delete("/ui/session", headers={"x-csrf-token": csrf})
    assert out.status_code == 200 and out.json() == {"signed_out": True}
    client.cookies.set(COOKIE_NAME, cookie)  # a copy of the old cookie is worth nothing
    stale = await client.get("/v1/admin/api_keys")
    assert stale.status_code == 401
    assert "sign in again" in stale.json()["error"]["message"]


async def test_with_the_console_off_there_is_no_page_and_no_cookie_credential():
    app = build({"auth": {"api_keys": KEYS}, "console": {"enabled": False}})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert app_state(app).security.sessions is None
            assert (await client.get("/ui")).status_code == 401  # an unknown path
            client.cookies.set(COOKIE_NAME, "anything")
            assert (await client.get("/v1/models")).status_code == 401


async def test_another_console_path_and_auth_off():
    app = build({"console": {"path": "/console"}})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            page = await client.get("/console")
            assert 'src="/console/static/app.js"' in page.text
            me = (await client.get("/console/session")).json()
            assert me["auth_enabled"] is False and "admin" in me["scopes"]
            signed = await client.post("/console/session", json={"api_key": "anything"})
            assert signed.json()["auth_enabled"] is False
            assert "set-cookie" not in signed.headers


async def test_under_tls_the_cookie_is_secure(tmp_path):
    tls = {"enabled": True, "cert_path": str(tmp_path / "c.pem"), "key_path": str(tmp_path / "k")}
    app = build({"auth": {"api_keys": KEYS}, "server": {"tls": tls}})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="https://test") as client:
            answer = await client.post("/ui/session", json={"api_key": ADMIN_KEY})
            assert "secure" in answer.headers["set-cookie"].lower()
            assert (await client.get("/ui/")).status_code == 200  # the trailing slash too


def test_the_console_path_must_not_shadow_the_api():
    for path in ("/v1", "/api", "/metrics", "ui", "/a/b", "/UI"):
        with pytest.raises(ValueError):
            Settings.model_validate({"console": {"path": path}})


async def test_usage_counts_requests_per_key_and_model(console):
    _, client = console
    headers = {"authorization": f"Bearer {GENERATE_KEY}"}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for _ in range(2):
        done = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert done.status_code == 200, done.text
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    usage = (await client.get("/v1/admin/usage?window=5m", headers=admin)).json()
    (row,) = [r for r in usage["data"] if r["key"] == "app"]
    assert row["requests"] == 2 and row["model"] == fake_model_info().model_id
    assert row["total_tokens"] == row["prompt_tokens"] + row["completion_tokens"] > 0
    assert sum(m["requests"] for m in usage["series"]) >= 2
    by_tenant = (await client.get("/v1/admin/usage?group_by=tenant", headers=admin)).json()
    assert all(r["key"] is None and r["model"] is None for r in by_tenant["data"])
    for query in ("window=7d", "group_by=user", "group_by="):
        bad = await client.get(f"/v1/admin/usage?{query}", headers=admin)
        assert bad.status_code == 400, query
    recent = (await client.get("/debug/requests", headers=admin)).json()["recent"]
    assert recent[0]["model"] == fake_model_info().model_id
