"""Builds the security state of the app and installs its middleware (DESIGN.md §4).

Owns: `SecurityState` (policy source, authenticator; `app.state.security`),
`build_security` (settings → state; loads or creates the policy store, so call it before
loading the model to fail fast; the default limits, tiers and guardrails of the settings
come from `security.settings_policy.base_policy`) and `install_security` (the middleware,
in DESIGN order: CORS → audit → authn → rate limit). Does not own: the scope each router
needs (`api/app.py` declares it where the router is included).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from inferflux.api.errors import error_response
from inferflux.api.metrics import is_public
from inferflux.api.security_setup import SecurityLayer
from inferflux.config.settings import Settings
from inferflux.security.api_keys import KeyDigester
from inferflux.security.audit import AuditMiddleware
from inferflux.security.authn import HEALTH_PATHS, AuthenticationMiddleware, Authenticator
from inferflux.security.live_policy import LivePolicy, build_live_policy
from inferflux.security.oidc import OidcVerifier
from inferflux.security.policy import Policy
from inferflux.security.policy_store import PolicyStore
from inferflux.security.principal import Scope
from inferflux.security.rate_limit import RateLimitMiddleware
from inferflux.security.rbac import roles_table
from inferflux.security.settings_policy import base_policy

CORS_HEADERS = ["authorization", "content-type", "x-api-key", "x-request-id", "traceparent"]
CORS_EXPOSED = [
    "x-request-id",
    "retry-after",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
]


@dataclass(frozen=True, slots=True)
class SecurityState:
    """The app's security parts. `policy` changes (admin API); the rest is fixed."""

    policy: LivePolicy
    authenticator: Authenticator
    digester: KeyDigester
    roles: dict[str, frozenset[Scope]]


def build_security(
    settings: Settings, *, base: Policy | None = None, store: PolicyStore | None = None
) -> SecurityState:
    """The security state for `settings`. Raises PolicyStoreError (the store cannot be
    read or created) or ConfigError (config keys clash with the store)."""
    auth = settings.auth
    pepper = auth.pepper.get_secret_value() if auth.pepper is not None else None
    digester = KeyDigester(pepper)
    roles = roles_table(auth.roles)
    policy = build_live_policy(
        auth, base if base is not None else base_policy(settings), digester, roles, store
    )
    oidc = OidcVerifier(auth.oidc) if auth.oidc.issuer is not None else None
    authenticator = Authenticator(policy, digester, roles=roles, oidc=oidc, configured=auth.enabled)
    return SecurityState(policy=policy, authenticator=authenticator, digester=digester, roles=roles)


def public_paths(settings: Settings) -> frozenset[str]:
    """Paths served without credentials: the health probes, and /metrics if public."""
    return HEALTH_PATHS | ({"/metrics"} if is_public(settings) else frozenset())


def install_security(
    app: FastAPI, settings: Settings, security: SecurityState, layer: SecurityLayer
) -> None:
    """Add rate limit → authentication → audit → CORS (`add_middleware` wraps: the last
    added is the outermost, so requests meet them in the reverse order). Call after the
    body-size limit and before telemetry."""
    app.state.security = security
    app.state.security_layer = layer
    if layer.limits is not None:
        app.add_middleware(RateLimitMiddleware, service=layer.limits, render_error=error_response)
    docs = (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    app.add_middleware(
        AuthenticationMiddleware,
        authenticator=security.authenticator,
        public_paths=public_paths(settings),
        path_scopes={path: Scope.READ for path in docs if path},
        render_error=error_response,
    )
    if layer.audit is not None:
        excluded = frozenset(settings.audit.exclude_paths)
        app.add_middleware(AuditMiddleware, audit=layer.audit, exclude_paths=excluded)
    if settings.server.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.server.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"],
            allow_headers=CORS_HEADERS,
            expose_headers=CORS_EXPOSED,
            allow_credentials=False,
            max_age=600,
        )
