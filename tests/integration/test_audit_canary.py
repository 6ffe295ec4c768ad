"""Canary: secrets sent through every route (headers, query string, body) appear in no
log line (application log, uvicorn access log, audit log) and in no response body. The
audit log still records each request, with the prompt as a keyed digest."""

from __future__ import annotations

import json

import httpx
import jwt as jwt_lib
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.integration.security_support import OpaServer
from tests.integration.server_process import ServerProcess, free_port

pytestmark = pytest.mark.server

SECRET_KEY = "sk-canary-9f8e7d6c5b4a39281706"
JWT = (
    "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJjYW5hcnktdXNlciIsImF1ZCI6ImluZmVyZmx1eCJ9"
    ".c2lnbmF0dXJlLWNhbmFyeS0xMjM0NTY3ODkw"
)
EMAIL = "canary.person@example.org"
CARD = "4111111111111111"
CANARIES = (SECRET_KEY, JWT, EMAIL, CARD)
PUBLIC_PATHS = ("/healthz", "/livez", "/readyz", "/metrics")  # /metrics: public by default


def _body(path: str, model: str) -> dict:
    """A valid body for the route, with the canaries in its text."""
    text = f"My key is {SECRET_KEY}, token {JWT}, mail {EMAIL}, card {CARD}. Say hi."
    messages = [{"role": "user", "content": text}]
    if path.startswith("/api/"):
        limits = {"options": {"num_predict": 4}}
        if "embed" in path:
            return {"model": model, "input": text, "prompt": text}
        if path == "/api/chat":
            return {"model": model, "messages": messages, **limits}
        return {"model": model, "prompt": text, "name": model, **limits}
    if "embed" in path:
        return {"input": text}
    if path in ("/v1/chat/completions", "/chat"):
        return {"messages": messages, "max_tokens": 4}
    return {"prompt": text, "max_tokens": 4}


def _auth_config(tmp_path) -> tuple[str, ...]:
    """`--config` with the canary key as a configured admin key (auth on)."""
    config = tmp_path / "inferflux.yaml"
    scopes = ["admin", "read", "generate", "adapter-manager"]
    entry = {"id": "canary", "key": SECRET_KEY, "scopes": scopes}
    config.write_text(yaml.safe_dump({"auth": {"api_keys": [entry]}}))
    return ("--config", str(config))


@pytest.mark.parametrize("auth", ["off", "on"])
def test_no_secret_reaches_a_log_line_or_an_error_body(tmp_path, auth):
    """With auth off the key is just another header; with auth on it is the valid admin
    key, so every route runs, and a second request per route puts it in the query string
    (refused with 401, the value redacted from the access log)."""
    audit_path = tmp_path / "audit.jsonl"
    log_path = tmp_path / "server.log"
    env = {
        "INFERFLUX_AUDIT__PATH": str(audit_path),
        "INFERFLUX_AUDIT__STDOUT": "true",
        "INFERFLUX_OBSERVABILITY__LOG_FILE": str(tmp_path / "app.jsonl"),
        "INFERFLUX_LOG_LEVEL": "debug",
        "INFERFLUX_GUARDRAILS__PII": "redact",
    }
    args = _auth_config(tmp_path) if auth == "on" else ()
    server = ServerProcess(*args, env=env, log_path=log_path)
    bodies: list[str] = []
    try:
        server.wait_ready(180)
        headers = {
            "Authorization": f"Bearer {SECRET_KEY}",
            "x-api-key": SECRET_KEY,
            "x-forwarded-authorization": f"Bearer {JWT}",
            "x-user-email": EMAIL,
        }
        leaky = {"api_key": SECRET_KEY, "token": JWT, "email": EMAIL, "card": CARD}
        # With auth on, credential-named parameters are refused, so the JWT rides as `jwt`.
        query = {"jwt": JWT, "email": EMAIL, "card": CARD} if auth == "on" else leaky
        with httpx.Client(base_url=server.url, timeout=60, headers=headers) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            schema = client.get("/openapi.json").json()
            routes = [
                (method.upper(), path.replace("{request_id}", "x").replace("{model}", model))
                for path, ops in schema["paths"].items()
                for method in ops
            ]
            assert len(routes) >= 20
            for method, path in routes:
                body = _body(path, model) if method == "POST" else None
                response = client.request(method, path, params=query, json=body)
                assert response.status_code < 500, (method, path, response.text[:300])
                bodies.append(response.text)
                if auth == "on" and path not in PUBLIC_PATHS:
                    refused = client.request(method, path, params=leaky, json=body)
                    assert refused.status_code == 401, (method, path)
                    bodies.append(refused.text)
    finally:
        server.close()
    logs = {
        "server output": log_path.read_text(errors="replace"),
        "app log": (tmp_path / "app.jsonl").read_text(errors="replace"),
        "audit log": audit_path.read_text(errors="replace"),
    }
    for where, text in logs.items():
        for canary in CANARIES:
            assert canary not in text, f"{canary[:12]}... leaked into the {where}"
    for body in bodies:
        for canary in (SECRET_KEY, JWT):
            assert canary not in body
    events = [json.loads(line) for line in logs["audit log"].splitlines()]
    generated = [e for e in events if e["completion_tokens"] > 0]
    assert {e["route"] for e in generated} >= {"/v1/chat/completions", "/api/chat", "/generate"}
    assert all(e["prompt"].startswith("hmac-sha256:") for e in generated)
    assert all("guardrail:pii:email:redact" in e["decisions"] for e in generated)
    assert "uvicorn.access" in logs["app log"] or '"GET /v1/models' in logs["server output"]


def _signed_jwt() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"sub": "canary", "aud": "inferflux", "iss": "https://idp.invalid"}
    return jwt_lib.encode(claims, key, algorithm="RS256", headers={"kid": "canary-kid"})


def test_outbound_urls_keep_their_credentials_out_of_every_log(tmp_path):
    """An OPA endpoint, a JWKS URL and a Redis URL that carry a password or a token in
    their userinfo or query string: each is used (an OPA decision per generation, a JWKS
    fetch for a JWT, Redis for the rate limits, down here), and none of the secrets
    reaches the server's output, the log file or the audit log, even at debug level."""
    opa = OpaServer()
    closed_port = free_port()
    secrets = ("canary-opa-pass", "canary-opa-token", "canary-jwks-token", "canary-redis-pass")
    opa_url = opa.url.replace("http://", "http://canary-opa-user:canary-opa-pass@")
    config = {
        "auth": {
            "api_keys": [{"id": "canary", "key": SECRET_KEY, "roles": ["admin"]}],
            "oidc": {
                "issuer": "https://idp.invalid",
                "audience": "inferflux",
                "jwks_url": f"http://127.0.0.1:{closed_port}/jwks?access_token=canary-jwks-token",
                "allow_insecure_loopback_jwks": True,
            },
        },
        "guardrails": {
            "opa_endpoint": f"{opa_url}/v1/data/inferflux/decision?token=canary-opa-token"
        },
        "redis": {"url": f"redis://:canary-redis-pass@127.0.0.1:{closed_port}/0"},
        "rate_limit": {"requests_per_minute": 1000},
    }
    config_path = tmp_path / "inferflux.yaml"
    config_path.write_text(yaml.safe_dump(config))
    audit_path, log_path = tmp_path / "audit.jsonl", tmp_path / "server.log"
    env = {
        "INFERFLUX_AUDIT__PATH": str(audit_path),
        "INFERFLUX_OBSERVABILITY__LOG_FILE": str(tmp_path / "app.jsonl"),
        "INFERFLUX_LOG_LEVEL": "debug",
    }
    server = ServerProcess("--config", str(config_path), env=env, log_path=log_path)
    try:
        server.wait_ready(180)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            headers = {"Authorization": f"Bearer {SECRET_KEY}"}
            chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
            answer = client.post("/v1/chat/completions", json=chat, headers=headers)
            assert answer.status_code == 200, answer.text
            assert opa.inputs, "the OPA endpoint was called"
            token = _signed_jwt()  # a kid the server has no key for: it fetches the JWKS
            jwt = client.get("/v1/models", headers={"Authorization": f"Bearer {token}"})
            assert jwt.status_code == 401  # the JWKS could not be fetched: refused
    finally:
        server.close()
        opa.close()
    logs = {
        "server output": log_path.read_text(errors="replace"),
        "app log": (tmp_path / "app.jsonl").read_text(errors="replace"),
        "audit log": audit_path.read_text(errors="replace"),
    }
    assert "JWKS fetch from" in logs["server output"]  # the lines that name the URLs ran
    assert "127.0.0.1" in logs["app log"]
    for where, text in logs.items():
        for secret in secrets:
            assert secret not in text, f"{secret} leaked into the {where}"
