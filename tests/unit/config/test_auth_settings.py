"""The auth, TLS and CORS settings: validation that names the key, secrets never echoed,
the passphrase only from the environment."""

from __future__ import annotations

import typing

import pytest
import yaml

from inferflux.config.auth_settings import ScopeName
from inferflux.config.loader import load_settings
from inferflux.errors import ConfigError
from inferflux.security.principal import Scope

PASS = "a long enough passphrase"


def refused(match: str, *, env: dict | None = None, config: dict | None = None, tmp_path=None):
    path = None
    if config is not None:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as info:
        load_settings(path, env=env or {})
    return info.value.message


def test_scope_names_match_the_security_scopes():
    assert set(typing.get_args(ScopeName)) == {s.value for s in Scope}


def test_env_aliases(tmp_path):
    env = {
        "INFERFLUX_AUTH_PEPPER": "pepper-value-xyz",
        "INFERFLUX_POLICY_STORE": str(tmp_path / "p.store"),
        "INFERFLUX_POLICY_PASSPHRASE": PASS,
        "INFERFLUX_TLS_ENABLED": "true",
        "INFERFLUX_TLS_CERT_PATH": "/c.pem",
        "INFERFLUX_TLS_KEY_PATH": "/k.pem",
        "INFERFLUX_SERVER__CORS_ORIGINS": "https://a.example, http://localhost:3000",
    }
    settings = load_settings(env=env)
    assert (
        settings.auth.pepper is not None
        and settings.auth.pepper.get_secret_value() == "pepper-value-xyz"
    )
    assert settings.auth.policy_passphrase is not None
    assert settings.server.tls.enabled and settings.server.tls.key_path == "/k.pem"
    assert settings.server.cors_origins == ["https://a.example", "http://localhost:3000"]
    assert PASS not in repr(settings) and "pepper-value-xyz" not in repr(settings)


def test_the_passphrase_is_refused_in_a_file(tmp_path):
    config = {"auth": {"policy_store": "/x", "policy_passphrase": PASS}}
    message = refused("never read from a file", config=config, tmp_path=tmp_path)
    assert "INFERFLUX_POLICY_PASSPHRASE" in message and PASS not in message


def test_a_store_needs_a_long_passphrase():
    message = refused("export INFERFLUX_POLICY_PASSPHRASE", env={"INFERFLUX_POLICY_STORE": "/x"})
    assert "12 characters" in message
    short = {"INFERFLUX_POLICY_STORE": "/x", "INFERFLUX_POLICY_PASSPHRASE": "short"}
    assert "short" not in refused("at least 12", env=short)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"key": "dev-key-123", "sha256": "ab" * 32, "scopes": ["read"]}, "exactly one"),
        ({"scopes": ["read"]}, "exactly one"),
        ({"key": "dev-key-123"}, "scopes` or `roles"),
        ({"key": "dev-key-123", "scopes": ["root"]}, "api_keys.0.scopes.0"),
        ({"key": "dev-key-123", "roles": ["wizard"]}, "unknown role"),
        ({"key": "short", "scopes": ["read"]}, "8 to 512 characters"),
        ({"sha256": "xyz", "scopes": ["read"]}, "64 hex digits"),
        ({"key": "dev-key-123", "scopes": ["read"], "tenant": "a b"}, "tenant"),
    ],
)
def test_bad_api_keys_are_named_and_never_quoted(tmp_path, entry, match):
    message = refused(match, config={"auth": {"api_keys": [entry]}}, tmp_path=tmp_path)
    assert "dev-key-123" not in message and "short" not in message.replace("shorter", "")
    assert "<redacted>" in message


@pytest.mark.parametrize(
    ("oidc", "match"),
    [
        ({"issuer": "https://i"}, "set oidc.audience too"),
        ({"issuer": "http://idp.example", "audience": "a"}, "discovery"),
        ({"issuer": "https://i", "audience": "a", "jwks_url": "http://idp/jwks"}, "https://"),
        (
            {
                "issuer": "https://i",
                "audience": "a",
                "jwks_url": "http://idp.example/jwks",
                "allow_insecure_loopback_jwks": True,
            },
            "loopback",
        ),
        ({"algorithms": ["none"]}, "algorithms"),
        ({"algorithms": ["HS256"]}, "algorithms"),
        ({"algorithms": []}, "algorithms"),
    ],
)
def test_bad_oidc_settings(tmp_path, oidc, match):
    refused(match, config={"auth": {"oidc": oidc}}, tmp_path=tmp_path)


def test_loopback_http_jwks_needs_the_explicit_flag(tmp_path):
    oidc = {"issuer": "https://i", "audience": "a", "jwks_url": "http://127.0.0.1:9/jwks"}
    refused("https://", config={"auth": {"oidc": oidc}}, tmp_path=tmp_path)
    path = tmp_path / "ok.yaml"
    path.write_text(
        yaml.safe_dump({"auth": {"oidc": {**oidc, "allow_insecure_loopback_jwks": True}}})
    )
    assert load_settings(path, env={}).auth.enabled


def test_tls_and_cors_checks():
    refused("set tls.cert_path and tls.key_path", env={"INFERFLUX_TLS_ENABLED": "1"})
    refused("is not an origin", env={"INFERFLUX_SERVER__CORS_ORIGINS": "example.com"})
    assert load_settings(env={"INFERFLUX_SERVER__CORS_ORIGINS": "*"}).server.cors_origins == ["*"]
    assert not load_settings(env={}).auth.enabled
