"""Console sign-in with an OIDC token (the same verifier as a bearer header): a session
whose principal comes from the token's claims and which ends no later than the token."""

from __future__ import annotations

import httpx
import pytest

from inferflux.security.sessions import COOKIE_NAME
from tests.integration.security.conftest import SecuredApp

pytestmark = pytest.mark.model


def browser(secured: SecuredApp) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=secured.app)
    return httpx.AsyncClient(transport=transport, base_url="http://inferflux")


async def test_an_oidc_token_signs_in_to_a_session_no_longer_than_the_token(secured):
    token = secured.rsa.token(scope="read generate", sub="oidc-user", tenant="acme")
    async with browser(secured) as client:
        signed = await client.post("/ui/session", json={"token": token})
        assert signed.status_code == 200, signed.text
        assert token not in signed.text
        view = signed.json()
        assert view["kind"] == "oidc" and view["subject"] == "oidc-user"
        assert view["tenant"] == "acme" and view["scopes"] == ["generate", "read"]
        assert 0 < view["expires_in_s"] <= 300  # the token's exp, not absolute_timeout_s
        assert client.cookies.get(COOKIE_NAME)
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/v1/admin/api_keys")).status_code == 403


async def test_a_forged_or_expired_token_opens_no_session(secured):
    expired = secured.rsa.token(exp=1_000_000_000)
    head, payload, _ = secured.rsa.token().split(".")
    for token in (expired, f"{head}.{payload}.forged", "not-a-jwt"):
        async with browser(secured) as client:
            answer = await client.post("/ui/session", json={"token": token})
            assert answer.status_code == 401, token
            assert answer.json()["error"]["type"] == "authentication_error"
            assert COOKIE_NAME not in client.cookies
