"""The `auth` section and the transport settings of `server` (`server.tls`, CORS origins).

Authentication is on as soon as any API key (here or in the policy store) or an OIDC
issuer is configured; with neither, every request runs as the anonymous principal and
`inferflux serve` logs a loud warning. Secrets (`api_keys[].key`, `pepper`,
`policy_passphrase`) are `SecretStr`: never in a repr, never in an error message. The
passphrase is read from the environment only (`config/loader.py` refuses it in a file).

Scope names are spelled here as literals: `config` imports no layer, so it cannot use
`security.Scope` (the two lists are kept equal by a unit test).
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from inferflux.config.policy_schema import NAME_PATTERN, LimitFields

ScopeName = Literal["admin", "read", "generate", "adapter-manager"]
PriorityName = Literal["high", "normal", "low"]
# Asymmetric JWS algorithms only: `none` and HS* (a shared secret, or worse the public key
# used as one) can never be configured.
JwtAlgorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384"]

DEFAULT_ALGORITHMS: tuple[JwtAlgorithm, ...] = ("RS256", "ES256")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MIN_PASSPHRASE_CHARS = 12

DEFAULT_ROLES: dict[str, list[ScopeName]] = {
    "admin": ["admin", "read", "generate", "adapter-manager"],
    "user": ["read", "generate"],
    "reader": ["read"],
    "adapter-manager": ["read", "adapter-manager"],
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class _Limits(_Section, LimitFields):
    """A key's or tenant's own limits (`LimitFields`), flat in its entry."""


class ApiKeySettings(_Limits):
    """One API key. Exactly one of `key` (plaintext, for development: hashed on load and
    never kept) or `sha256` (the hex digest; HMAC-SHA-256 with `auth.pepper` when one is
    set: `inferflux digest-key` prints it)."""

    key: SecretStr | None = Field(
        None, description="The key in plaintext (development only; hashed on load)."
    )
    sha256: str | None = Field(
        None,
        description="Hex SHA-256 of the key (HMAC-SHA-256 keyed with auth.pepper when set).",
    )
    id: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="Public key id, shown in logs and the admin API. Unset: `cfg-` and 12 "
        "hex digits of the digest.",
    )
    tenant: str = Field("default", pattern=NAME_PATTERN, description="Tenant of the key.")
    scopes: list[ScopeName] = Field(
        default_factory=list, description="RBAC scopes: admin, read, generate, adapter-manager."
    )
    roles: list[str] = Field(
        default_factory=list, description="Roles from auth.roles; their scopes are added."
    )
    rate_limit_tier: str | None = Field(
        None, pattern=NAME_PATTERN, description="Rate-limit tier name (its limits apply)."
    )
    priority_cap: PriorityName | None = Field(
        None, description="Highest scheduling priority this key may ask for."
    )
    allowed_models: list[str] | None = Field(
        None, description="Model ids this key may use. Unset: every served model."
    )

    @field_validator("key")
    @classmethod
    def _key_length(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not 8 <= len(value.get_secret_value()) <= 512:
            raise ValueError("a key must be 8 to 512 characters long")
        return value

    @field_validator("sha256")
    @classmethod
    def _digest_shape(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256_HEX.fullmatch(value.lower()):
            raise ValueError("sha256 must be 64 hex digits (a SHA-256 digest)")
        return None if value is None else value.lower()

    @model_validator(mode="after")
    def _one_secret_some_scope(self) -> Self:
        if (self.key is None) == (self.sha256 is None):
            raise ValueError("give exactly one of `key` (plaintext) or `sha256` (its digest)")
        if not self.scopes and not self.roles:
            raise ValueError("give the key `scopes` or `roles` (it would be useless without)")
        return self


class TenantSettings(_Limits):
    """One tenant: its limits, models and priority cap. A tenant that keys name but nobody
    configured gets the default limits. Once a policy store exists, tenants live there
    (the admin API changes them) and this list only seeds a new store."""

    name: str = Field(pattern=NAME_PATTERN, description="Tenant name (keys name it).")
    allowed_models: list[str] | None = Field(
        None, description="Model ids the tenant may use. Unset: every served model."
    )
    priority_cap: PriorityName | None = Field(
        None, description="Highest scheduling priority the tenant's requests may ask for."
    )
    share_prefix_cache: bool = Field(
        False, description="Share cached prompt prefixes with other tenants (opt-in)."
    )


class OidcSettings(_Section):
    issuer: str | None = Field(
        None, description="Expected `iss` of bearer JWTs. Set: OIDC authentication is on."
    )
    audience: str | None = Field(None, description="Expected `aud` (required with issuer).")
    jwks_url: str | None = Field(
        None,
        description="The issuer's JWKS URL (https). Unset: discovered from the issuer's "
        "/.well-known/openid-configuration (`jwks_uri`; the document's `issuer` must equal "
        "oidc.issuer).",
    )
    algorithms: list[JwtAlgorithm] = Field(
        default_factory=lambda: list(DEFAULT_ALGORITHMS),
        min_length=1,
        description="Accepted JWS algorithms (asymmetric only; never none or HS*).",
    )
    leeway_s: float = Field(30.0, ge=0, le=300, description="Clock skew allowed on exp/nbf.")
    require_nbf: bool = Field(
        True, description="Refuse tokens without `nbf` (turn off for IdPs that omit it)."
    )
    scope_claim: str = Field(
        "scope", min_length=1, description="Claim with scopes (space-separated or a list)."
    )
    roles_claim: str = Field(
        "roles", min_length=1, description="Claim with role names, mapped by auth.roles."
    )
    tenant_claim: str = Field("tenant", min_length=1, description="Claim naming the tenant.")
    default_tenant: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="Tenant of tokens without the tenant claim. Unset: such tokens get 401.",
    )
    jwks_max_age_s: float = Field(
        3600.0, ge=10, le=7 * 86_400, description="Refetch the JWKS when older than this."
    )
    jwks_refetch_cooldown_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="Least time between refetches triggered by an unknown `kid`.",
    )
    jwks_timeout_s: float = Field(5.0, gt=0, le=60, description="Timeout of one JWKS fetch.")
    jwks_ca_file: str | None = Field(
        None, description="PEM CA bundle that verifies the JWKS server. Unset: system CAs."
    )
    allow_insecure_loopback_jwks: bool = Field(
        False,
        description="Accept an http:// jwks_url on a loopback host (tests only; never in "
        "production).",
    )
    max_token_bytes: int = Field(
        8192, ge=1024, le=65_536, description="Longer bearer tokens are refused unparsed."
    )

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.issuer is None:
            return self
        if not self.audience:
            raise ValueError("with oidc.issuer set, set oidc.audience too")
        if self.jwks_url is not None:
            self.check_fetch_url(self.jwks_url, "jwks_url")
        else:  # discovery: the issuer is where the keys are found
            self.check_fetch_url(self.issuer, "issuer (without jwks_url, discovery)")
        return self

    def check_fetch_url(self, url: str, what: str) -> None:
        """Raise ValueError unless `url` is one the server may fetch keys from: https, or
        http on a loopback host with `allow_insecure_loopback_jwks` (tests)."""
        parts = urlsplit(url)
        if parts.scheme == "https" and parts.hostname:
            return
        loopback = self.allow_insecure_loopback_jwks and _loopback(parts.hostname)
        if parts.scheme == "http" and loopback:
            return
        raise ValueError(
            f"{what} {url!r} must be an https:// URL (http:// only on a loopback host with "
            "oidc.allow_insecure_loopback_jwks, for tests)"
        )


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AuthSettings(_Section):
    api_keys: list[ApiKeySettings] = Field(
        default_factory=list, description="API keys (see the auth.api_keys[] table)."
    )
    pepper: SecretStr | None = Field(
        None,
        description="Server secret: key digests become HMAC-SHA-256(pepper, key). Changing "
        "it invalidates every stored digest.",
    )
    oidc: OidcSettings = Field(default_factory=OidcSettings)  # type: ignore[arg-type]
    roles: dict[str, list[ScopeName]] = Field(
        default_factory=lambda: {k: list(v) for k, v in DEFAULT_ROLES.items()},
        description="Role name → scopes, for keys' `roles` and the OIDC roles claim.",
    )
    tenants: list[TenantSettings] = Field(
        default_factory=list, description="Tenants (see the auth.tenants[] table)."
    )
    policy_store: str | None = Field(
        None,
        description="Encrypted policy store file (created if missing). Unset: policy from "
        "config only; admin API changes last until restart.",
    )
    policy_passphrase: SecretStr | None = Field(
        None,
        description="Passphrase of the policy store, and of the policy snapshots that "
        "policy replication keeps in Redis (the same on every replica). Environment only "
        "(INFERFLUX_POLICY_PASSPHRASE); refused in a config file.",
    )
    policy_accept_rollback: bool = Field(
        False,
        description="Load a policy store older than one written before (a restored "
        "backup) instead of refusing to start. For one start only: it resets the "
        "recorded version.",
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_from_json(cls, value: object) -> object:
        """From the environment (`INFERFLUX_AUTH__API_KEYS`, e.g. a Kubernetes Secret), the
        list comes as JSON text: `[{"id": "ops", "sha256": "...", "roles": ["admin"]}]`."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError(
                    "api_keys from the environment must be a JSON list of keys"
                ) from None
        return value

    @property
    def enabled(self) -> bool:
        """Auth from config alone: any key or an OIDC issuer (the store may add keys)."""
        return bool(self.api_keys) or self.oidc.issuer is not None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for entry in self.api_keys:
            unknown = [role for role in entry.roles if role not in self.roles]
            if unknown:
                raise ValueError(f"api_keys: unknown role(s) {unknown}: define them in auth.roles")
        names = [t.name for t in self.tenants]
        if len(names) != len(set(names)):
            raise ValueError("tenants: a tenant name appears twice")
        ids = [k.id for k in self.api_keys if k.id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("api_keys: a key id appears twice")
        if self.policy_store is not None:
            passphrase = self.policy_passphrase
            if passphrase is None or len(passphrase.get_secret_value()) < MIN_PASSPHRASE_CHARS:
                raise ValueError(
                    "policy_store is set: export INFERFLUX_POLICY_PASSPHRASE with at least "
                    f"{MIN_PASSPHRASE_CHARS} characters"
                )
        return self


class TlsSettings(_Section):
    enabled: bool = Field(False, description="Serve HTTPS (TLS 1.2 or later) in-process.")
    cert_path: str | None = Field(None, description="PEM certificate chain (required if enabled).")
    key_path: str | None = Field(None, description="PEM private key (required if enabled).")

    @model_validator(mode="after")
    def _paths_given(self) -> Self:
        if self.enabled and (not self.cert_path or not self.key_path):
            raise ValueError(
                "tls.enabled is true: set tls.cert_path and tls.key_path "
                "(INFERFLUX_TLS_CERT_PATH, INFERFLUX_TLS_KEY_PATH)"
            )
        return self


_ORIGIN = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+")


def check_cors_origins(value: object) -> list[str]:
    """`server.cors_origins`: a list, or a comma-separated string (env); `*` or origins."""
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ValueError("cors_origins must be a list of origins")
    origins = [str(item).rstrip("/") for item in items if str(item).strip()]
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ValueError(f"{origin!r} is not an origin such as https://app.example.com")
    return origins
