"""OIDC bearer tokens on the real app, keys from a loopback HTTPS JWKS server: valid tokens
map to principals; every forged or broken token is 401 (never 500)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from inferflux.config.auth_settings import OidcSettings
from inferflux.security.oidc import JwksCache, OidcVerifier, TokenRejected
from tests.integration.security.conftest import SecuredApp
from tests.integration.security.jwks_server import AUDIENCE, ISSUER, SigningKey, standard_claims

pytestmark = pytest.mark.model


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(header: dict, claims: dict) -> str:
    """`header.payload` (no signature yet)."""
    return b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())


async def status_of(secured: SecuredApp, token: str, path: str = "/v1/models") -> int:
    async with secured.client(token) as client:
        response = await client.get(path)
    assert not token or token not in response.text
    if response.status_code == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")
    return response.status_code


async def test_valid_rs256_and_es256_tokens_are_accepted(secured: SecuredApp):
    for key in (secured.rsa, secured.ec):
        token = key.token()
        assert await status_of(secured, token) == 200
        async with secured.client(token) as client:
            done = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
            assert done.status_code == 200
            assert (await client.get("/v1/admin/api_keys")).status_code == 403


async def test_scopes_roles_and_tenant_come_from_claims(secured: SecuredApp):
    admin = secured.rsa.token(scope=None, roles=["admin"], sub="ops-1", tenant="ops")
    reader = secured.rsa.token(scope="read email", sub="r-1")
    none = secured.rsa.token(scope="openid profile")
    assert await status_of(secured, admin, "/v1/admin/api_keys") == 200
    assert await status_of(secured, reader, "/v1/models") == 200
    async with secured.client(reader) as client:
        assert (await client.post("/tokenize", json={"prompt": "x"})).status_code == 403
    assert await status_of(secured, none, "/v1/models") == 403
    async with secured.client(secured.rsa.token(scope=["read", "generate"])) as client:
        assert (await client.post("/tokenize", json={"prompt": "x"})).status_code == 200


def forged_tokens(secured: SecuredApp) -> dict[str, str]:
    rsa, ec = secured.rsa, secured.ec
    now = int(time.time())
    claims = standard_claims()
    impostor = SigningKey(rsa.kid, "RS256")  # same kid, another key
    attacker = SigningKey("attacker", "RS256")
    pem = rsa.private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    hs_input = unsigned({"alg": "HS256", "typ": "JWT", "kid": rsa.kid}, claims)
    hs_signature = hmac.new(pem, hs_input.encode(), hashlib.sha256).digest()
    valid = rsa.token()
    head, payload, signature = valid.split(".")
    tampered_claims = b64(json.dumps(standard_claims(scope="admin read generate")).encode())
    return {
        "alg none": unsigned({"alg": "none", "kid": rsa.kid}, claims) + ".",
        "alg None": unsigned({"alg": "None", "kid": rsa.kid}, claims) + ".",
        "HS256 keyed with the public key": f"{hs_input}.{b64(hs_signature)}",
        "unknown kid": jwt.encode(claims, attacker.private, "RS256", {"kid": "nope"}),
        "no kid": jwt.encode(claims, rsa.private, "RS256"),
        "expired": rsa.token(exp=now - 3600, iat=now - 7200, nbf=now - 7200),
        "future nbf": rsa.token(nbf=now + 3600),
        "wrong aud": rsa.token(aud="someone-else"),
        "wrong iss": rsa.token(iss="https://evil.test"),
        "no exp": rsa.token(exp=None),
        "no nbf": rsa.token(nbf=None),
        "no aud": rsa.token(aud=None),
        "no sub": rsa.token(sub=None),
        "no tenant": rsa.token(tenant=None),
        "bad tenant": rsa.token(tenant="../../etc"),
        "stripped signature": f"{head}.{payload}.",
        "altered payload": f"{head}.{tampered_claims}.{signature}",
        "altered signature": f"{head}.{payload}.{signature[:-4]}AAAA",
        "garbage": "abc.def.ghi",
        "not base64": "!!!.???.***",
        "header not json": b64(b"nope") + "." + payload + "." + signature,
        "huge": rsa.token(padding="x" * 9000),
        "same kid, another key": impostor.token(),
        "jku and jwk headers pointing elsewhere": attacker.token(
            headers={
                "kid": rsa.kid,
                "jku": "https://evil.test/jwks.json",
                "x5u": "https://evil.test/cert.pem",
                "jwk": attacker.jwk,
            }
        ),
        "ES256 alg with the RSA kid": jwt.encode(claims, ec.private, "ES256", {"kid": rsa.kid}),
        "RS256 alg with the EC kid": jwt.encode(claims, rsa.private, "RS256", {"kid": ec.kid}),
        "RS512 (not allowed)": jwt.encode(claims, rsa.private, "RS512", {"kid": rsa.kid}),
        "two segments": f"{head}.{payload}",
        "empty": "",
    }


async def test_every_forged_token_is_401(secured: SecuredApp):
    forged = forged_tokens(secured)
    results = {name: await status_of(secured, token) for name, token in forged.items()}
    assert results == dict.fromkeys(results, 401)


async def test_forged_token_errors_name_the_reason_not_the_token(secured: SecuredApp):
    async with secured.client(secured.rsa.token(exp=int(time.time()) - 3600)) as client:
        body = (await client.get("/v1/models")).json()
    assert body["error"]["code"] == "invalid_token"
    assert body["error"]["message"] == "the bearer token is not valid (expired)"


def oidc_settings(secured: SecuredApp, **values) -> OidcSettings:
    return OidcSettings(
        issuer=ISSUER,
        audience=AUDIENCE,
        jwks_url=secured.jwks.url,
        jwks_ca_file=str(secured.jwks.ca_path),
        **values,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_jwks_cache_max_age_unknown_kid_cooldown_and_outage(secured: SecuredApp):
    server = secured.jwks
    clock = Clock()
    settings = oidc_settings(secured, jwks_max_age_s=60, jwks_refetch_cooldown_s=10)
    verifier = OidcVerifier(settings, JwksCache(settings, clock))
    rotated = SigningKey("rsa-2", "RS256")
    original = list(server.keys)
    try:
        before = server.num_requests
        await verifier.verify(secured.rsa.token())
        await verifier.verify(secured.rsa.token())
        assert server.num_requests == before + 1  # cached
        # a new kid: refetched once the cooldown allows it
        server.keys = [*original, rotated.jwk]
        clock.now += 5
        with pytest.raises(TokenRejected, match="unknown key id"):
            await verifier.verify(rotated.token())
        assert server.num_requests == before + 1  # within the cooldown: no fetch
        clock.now += 10
        assert (await verifier.verify(rotated.token()))["sub"] == "user-1"
        assert server.num_requests == before + 2
        # issuer outage after max age: the last good keys keep working
        server.fail = True
        clock.now += 120
        assert (await verifier.verify(secured.rsa.token()))["iss"] == ISSUER
        assert server.num_requests == before + 3
    finally:
        server.fail = False
        server.keys = original


async def test_an_untrusted_jwks_certificate_yields_no_keys(secured: SecuredApp):
    settings = oidc_settings(secured).model_copy(update={"jwks_ca_file": None})
    verifier = OidcVerifier(settings)
    with pytest.raises(TokenRejected, match="unknown key id"):
        await verifier.verify(secured.rsa.token())


def discovered_settings(secured: SecuredApp) -> OidcSettings:
    """The issuer alone (no jwks_url): keys found through OIDC discovery."""
    return OidcSettings(
        issuer=secured.jwks.base_url,
        audience=AUDIENCE,
        jwks_ca_file=str(secured.jwks.ca_path),
    )


async def test_the_issuer_alone_finds_its_keys_through_discovery(secured: SecuredApp):
    verifier = OidcVerifier(discovered_settings(secured))
    claims = await verifier.verify(secured.rsa.token(iss=secured.jwks.base_url))
    assert claims["sub"] == "user-1"
    with pytest.raises(TokenRejected, match="wrong issuer"):
        await verifier.verify(secured.rsa.token())  # signed right, but another issuer


@pytest.mark.parametrize(
    "discovery",
    [
        {"issuer": "https://impostor.test"},  # the document speaks for another issuer
        {"jwks_uri": "http://evil.example/jwks.json"},  # keys from a plain-http URL
        {"jwks_uri": None},
    ],
)
async def test_a_discovery_document_that_does_not_fit_yields_no_keys(
    secured: SecuredApp, discovery: dict
):
    """Fail closed: no keys, so every token is refused (and nothing else is trusted)."""
    secured.jwks.discovery = discovery
    try:
        verifier = OidcVerifier(discovered_settings(secured))
        with pytest.raises(TokenRejected, match="unknown key id"):
            await verifier.verify(secured.rsa.token(iss=secured.jwks.base_url))
    finally:
        secured.jwks.discovery = {}
