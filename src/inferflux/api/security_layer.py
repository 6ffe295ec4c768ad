"""The security layer of one app: its parts, built from settings, and their middleware.

Owns: `SecurityState` (policy source, authenticator, key digester, roles: what
authentication needs, built by `build_security` before the model loads so that a bad
policy store fails fast; the default limits, tiers and guardrails of the settings come
from `security.settings_policy.base_policy`), `SecurityLayer` (rate limits, guardrails,
the audit log, built by `make_security_layer` once the app's metrics exist),
`SecurityEvents` (security events → metrics) and `install_security` (the middleware in
order: CORS → audit → authn → rate limit). Does not own: the scope each router needs
(`api/app.py` declares it where the router is included).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import httpx
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from inferflux.api.errors import error_response
from inferflux.config.settings import Settings
from inferflux.observability.metrics import Metrics
from inferflux.security.api_keys import KeyDigester
from inferflux.security.audit import AuditLog, AuditMiddleware, make_audit_log
from inferflux.security.authn import HEALTH_PATHS, AuthenticationMiddleware, Authenticator
from inferflux.security.digest import TextDigester
from inferflux.security.guardrails import Guardrails
from inferflux.security.live_policy import LivePolicy, build_live_policy
from inferflux.security.oidc import OidcVerifier
from inferflux.security.policy import Policy, PolicySource, StaticPolicySource
from inferflux.security.policy_store import PolicyStore
from inferflux.security.policy_sync import PolicySync, make_policy_sync
from inferflux.security.policy_witness import FileWitness, RedisWitness, VersionWitness
from inferflux.security.principal import Scope
from inferflux.security.rate_limit import (
    RateLimiter,
    RateLimitMiddleware,
    RateLimitService,
    make_rate_limiter,
)
from inferflux.security.rbac import roles_table
from inferflux.security.sessions import CookieSessions, SessionStore
from inferflux.security.settings_policy import base_policy

logger = logging.getLogger(__name__)

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
    """What authentication needs. `policy` changes (admin API, and other replicas through
    `sync` when `redis.url` is set: the app's lifespan starts and closes it); `sessions`
    holds the web console's sign-ins (None when `console.enabled` is off)."""

    policy: LivePolicy
    authenticator: Authenticator
    digester: KeyDigester
    roles: dict[str, frozenset[Scope]]
    sync: PolicySync | None = None
    sessions: CookieSessions | None = None


def build_security(
    settings: Settings, *, base: Policy | None = None, store: PolicyStore | None = None
) -> SecurityState:
    """The security state for `settings`. Raises PolicyStoreError (the store cannot be
    read or created) or ConfigError (config keys clash with the store)."""
    auth = settings.auth
    pepper = auth.pepper.get_secret_value() if auth.pepper is not None else None
    digester = KeyDigester(pepper)
    roles = roles_table(auth.roles)
    base = base if base is not None else base_policy(settings)
    policy = build_live_policy(auth, base, digester, roles, store, policy_witnesses(settings))
    oidc = OidcVerifier(auth.oidc) if auth.oidc.issuer is not None else None
    authenticator = Authenticator(policy, digester, roles=roles, oidc=oidc, configured=auth.enabled)
    passphrase = auth.policy_passphrase.get_secret_value() if auth.policy_passphrase else None
    sync = make_policy_sync(settings.redis, policy, passphrase)
    return SecurityState(policy, authenticator, digester, roles, sync, console_sessions(settings))


def console_sessions(settings: Settings) -> CookieSessions | None:
    """The web console's session store (in this API process's memory), or None when the
    console is off."""
    console = settings.console
    if not console.enabled:
        return None
    store = SessionStore(
        idle_timeout_s=console.idle_timeout_s,
        absolute_timeout_s=console.absolute_timeout_s,
        max_sessions=console.max_sessions,
    )
    return CookieSessions(store, console.path)


def policy_witnesses(settings: Settings) -> list[VersionWitness]:
    """Where the policy store's versions are recorded: its sidecar file, and Redis when
    `redis.url` is set (rollback detection, security/policy_witness.py)."""
    if settings.auth.policy_store is None:
        return []
    witnesses: list[VersionWitness] = [FileWitness(Path(settings.auth.policy_store))]
    if settings.redis.url is not None:
        url = settings.redis.url.get_secret_value()
        witnesses.append(RedisWitness(url, prefix="inferflux", timeout_s=settings.redis.timeout_s))
    return witnesses


def public_paths(settings: Settings) -> frozenset[str]:
    """Paths served without credentials: the health probes, and /metrics if public."""
    public_metrics = settings.observability.metrics.public
    return HEALTH_PATHS | ({"/metrics"} if public_metrics else frozenset())


def install_security(
    app: FastAPI, settings: Settings, security: SecurityState, layer: SecurityLayer
) -> None:
    """Add rate limit → authentication → audit → CORS (`add_middleware` wraps: the last
    added is the outermost, so requests meet them in the reverse order). Call after the
    body-size limit and before telemetry."""
    if layer.limits is not None:
        app.add_middleware(RateLimitMiddleware, service=layer.limits, render_error=error_response)
    docs = (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    app.add_middleware(
        AuthenticationMiddleware,
        authenticator=security.authenticator,
        public_paths=public_paths(settings),
        path_scopes={path: Scope.READ for path in docs if path},
        render_error=error_response,
        sessions=security.sessions,
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


class SecurityEvents:
    """The exporter: rate-limit and guardrail events → `Metrics` (None: metrics off)."""

    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics

    def on_decision(self, kind: str, allowed: bool) -> None:
        if self.metrics is not None:
            outcome = "allowed" if allowed else "rejected"
            self.metrics.rate_limit_decisions.labels(kind, outcome).inc()

    def on_redis_failure(self) -> None:
        if self.metrics is not None:
            self.metrics.rate_limit_redis_failures.inc()

    def on_fallback_decision(self, mode: str) -> None:
        if self.metrics is not None:
            self.metrics.rate_limit_fallbacks.labels(mode).inc()

    def on_redis_up(self, up: bool) -> None:
        if self.metrics is not None:
            self.metrics.rate_limit_redis_up.set(1.0 if up else 0.0)

    def on_audit_dropped(self) -> None:
        if self.metrics is not None:
            self.metrics.audit_lines_dropped.inc()

    def on_verdict(self, stage: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.guardrail_verdict.labels(stage).observe(seconds)

    def on_guardrail(self, stage: str, rule: str, action: str) -> None:
        if self.metrics is not None:
            self.metrics.guardrail_decisions.labels(stage, rule, action).inc()


class _GuardrailEvents:
    """`GuardrailEvents` over `SecurityEvents` (its `on_decision` name is taken)."""

    def __init__(self, events: SecurityEvents) -> None:
        self._events = events

    def on_verdict(self, stage: str, seconds: float) -> None:
        self._events.on_verdict(stage, seconds)

    def on_decision(self, stage: str, rule: str, action: str) -> None:
        self._events.on_guardrail(stage, rule, action)


@dataclass(slots=True)
class SecurityLayer:
    """The app's security components (`limits` None when rate limiting is off, `audit`
    None when the audit log is off or has no sink)."""

    settings: Settings
    source: PolicySource
    limiter: RateLimiter | None
    limits: RateLimitService | None
    guardrails: Guardrails
    audit: AuditLog | None

    async def aclose(self) -> None:
        """Close the Redis connection, the OPA client and the audit files."""
        if self.limiter is not None:
            await self.limiter.close()
        await self.guardrails.aclose()
        if self.audit is not None:
            self.audit.close()


def make_security_layer(
    settings: Settings, metrics: Metrics | None, source: PolicySource | None = None
) -> SecurityLayer:
    """The security layer `settings` describe. `source` replaces the policy built from
    settings alone (the policy store's, or a test's)."""
    source = source if source is not None else StaticPolicySource(base_policy(settings))
    events = SecurityEvents(metrics)
    limiter = limits = None
    if settings.rate_limit.enabled:
        limiter = make_rate_limiter(settings.redis, settings.rate_limit, events)
        limits = RateLimitService(limiter, source, settings.rate_limit, events)
    audit = make_audit_log(settings.audit, events.on_audit_dropped)
    digester = audit.digester if audit is not None else _digester(settings)
    guardrails = Guardrails(
        source,
        settings.guardrails,
        digester,
        httpx.AsyncClient(follow_redirects=False, trust_env=False),
        _GuardrailEvents(events),
    )
    return SecurityLayer(settings, source, limiter, limits, guardrails, audit)


def _digester(settings: Settings) -> TextDigester:
    key = settings.audit.hmac_key
    return TextDigester(key.get_secret_value().encode() if key else None)
