"""Building the security layer of one app from settings: the policy source, rate limits,
guardrails and the audit log, the metrics exporter they report to, and their middleware
(the policy source itself comes from `security_stack.build_security`: settings, config
keys and the policy store).

Owns `SecurityLayer`, `make_security_layer` and `SecurityEvents` (security events →
metrics). The middleware are installed by `api/security_stack.install_security`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx

from inferflux.config.settings import Settings
from inferflux.observability.metrics import Metrics
from inferflux.security.audit import AuditLog, make_audit_log
from inferflux.security.digest import TextDigester
from inferflux.security.guardrails import Guardrails
from inferflux.security.policy import PolicySource, StaticPolicySource
from inferflux.security.rate_limit import (
    RateLimiter,
    RateLimitService,
    make_rate_limiter,
)
from inferflux.security.settings_policy import base_policy

logger = logging.getLogger(__name__)


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
    audit = make_audit_log(settings.audit)
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
