"""Settings sections of the security layer's limits and controls: `redis`, `rate_limit`,
`audit`, `guardrails` (issue 6 part B). `config/settings.py` puts them into `Settings`.

Authentication, TLS and the policy store have sections of their own (part A). Secrets
(`audit.hmac_key`, a password inside `redis.url`) are `SecretStr`: printed as `**********`,
and the loader never quotes them in an error.
"""

from __future__ import annotations

import re
from typing import Literal

import re2
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def re2_error(pattern: str) -> str | None:
    """None when RE2 (the guardrails' regex engine: linear time, so no backreferences,
    lookaround, `\\Z`...) compiles `pattern`, else why not. The config file and the admin
    API check blocklist patterns with this one function, so they cannot drift."""
    options = re2.Options()
    options.log_errors = False
    try:
        re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    return None


class RedisSettings(_Section):
    url: SecretStr | None = Field(
        None,
        description="Redis for state shared across replicas (rate-limit counters), e.g. "
        "`redis://127.0.0.1:6379/0` or `rediss://:password@host:6380/0`. Unset: every "
        "replica keeps its state in memory.",
    )
    timeout_s: float = Field(
        0.25,
        gt=0,
        le=10,
        description="Connect and command timeout. A slower Redis counts as unreachable "
        "(rate_limit.redis_failure_mode decides what happens then).",
    )
    retry_after_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="After a Redis failure, requests skip Redis for this long before "
        "trying it again (so an outage costs one timeout, not one per request).",
    )

    @field_validator("url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value


class LimitSettings(_Section):
    """Limits of one tier (or the default). Unset (null) = unlimited."""

    requests_per_minute: int | None = Field(
        None, ge=1, le=10_000_000, description="Requests per minute (burst: a whole minute's)."
    )
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        description="Prompt plus completion tokens per minute.",
    )
    max_concurrent: int | None = Field(
        None, ge=1, le=100_000, description="Requests being answered at once."
    )


class RateLimitSettings(_Section):
    enabled: bool = Field(
        True,
        description="Enforce the limits of the policy (keys, tenants, tiers, the defaults "
        "below). With every limit unset nothing is limited either way.",
    )
    requests_per_minute: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="Default requests per minute of each key (or subject) without limits "
        "of its own or of its tier. Unset: unlimited.",
    )
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        description="Default tokens (prompt + completion) per minute of each key. Unset: "
        "unlimited.",
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Default requests in flight at once per key. Unset: unlimited.",
    )
    tiers: dict[str, LimitSettings] = Field(
        default_factory=dict,
        description="Named limit sets (YAML mapping: tier name → requests_per_minute, "
        "tokens_per_minute, max_concurrent) that keys select with their rate_limit_tier.",
    )
    redis_failure_mode: Literal["local", "open", "closed"] = Field(
        "local",
        description="With redis.url set and Redis unreachable: `local` = count in this "
        "replica's memory until Redis is back (the limit then holds per replica), `open` = "
        "allow everything, `closed` = refuse with 503 policy_unavailable.",
    )
    key_prefix: str = Field(
        "inferflux:rl",
        min_length=1,
        max_length=64,
        description="Prefix of every rate-limit key in Redis (replicas that share limits "
        "use the same prefix).",
    )
    concurrency_lease_s: float = Field(
        600.0,
        ge=1,
        le=86_400,
        description="In Redis, a request's concurrency slot expires after this long even "
        "if its replica died without releasing it.",
    )

    @field_validator("tiers")
    @classmethod
    def _tier_names(cls, tiers: dict[str, LimitSettings]) -> dict[str, LimitSettings]:
        for name in tiers:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
                raise ValueError(f"tier name {name!r}: use 1-64 letters, digits, _ . -")
        return tiers


class AuditSettings(_Section):
    enabled: bool = Field(
        True,
        description="Write one audit event per HTTP request (and per admin change) to "
        "`path` and/or stdout. Off: no audit trail.",
    )
    path: str | None = Field(
        None,
        description="JSON-lines audit file, rotated at max_bytes. Unset: no file.",
    )
    max_bytes: int = Field(
        100 * 1024 * 1024,
        ge=1024,
        le=1024**4,
        description="Size at which the audit file is rotated (renamed to .1, .2, ...).",
    )
    backup_count: int = Field(
        10, ge=0, le=10_000, description="Rotated audit files kept besides the current one."
    )
    stdout: bool = Field(
        False, description="Also write each audit event as one JSON line to stdout."
    )
    hmac_key: SecretStr | None = Field(
        None,
        min_length=16,
        description="Key of the HMAC-SHA-256 digests that stand for prompts and outputs in "
        "audit events (set it, e.g. from a secret store, so digests match across restarts "
        "and replicas). Unset: a random key per process, so digests correlate only within "
        "one process's lifetime.",
    )
    log_raw_text: bool = Field(
        False,
        description="DEBUG ONLY: write prompts and outputs as raw text instead of digests.",
    )
    exclude_paths: list[str] = Field(
        default_factory=lambda: ["/healthz", "/livez", "/readyz", "/metrics"],
        description="Paths not audited (probes and scrapes).",
    )


class GuardrailSettings(_Section):
    blocklist: list[str] = Field(
        default_factory=list,
        description="Words and phrases refused in prompts and outputs (case-insensitive, "
        "whole words).",
    )
    blocklist_regex: list[str] = Field(
        default_factory=list,
        description="Patterns refused in prompts and outputs (RE2 syntax: linear time, no "
        "backreferences or lookaround).",
    )
    pii: Literal["off", "redact", "block"] = Field(
        "off",
        description="Emails, phone numbers, card numbers (Luhn) and IBANs (mod 97): `redact` "
        "replaces them with [REDACTED_<KIND>] in prompts and outputs, `block` refuses them.",
    )
    opa_endpoint: str | None = Field(
        None,
        description="OPA Data API URL of a decision, e.g. "
        "`http://127.0.0.1:8181/v1/data/inferflux/allow`. Unset: no OPA decision.",
    )
    opa_timeout_s: float = Field(
        0.2, gt=0, le=30, description="Timeout of one OPA decision request."
    )
    opa_fail_open: bool = Field(
        False,
        description="Allow requests when OPA is unreachable or answers nonsense. Default: "
        "refuse them with 503 policy_unavailable (fail closed).",
    )
    opa_input: Literal["hash", "text"] = Field(
        "hash",
        description="What OPA's input carries of the prompt: `hash` (an HMAC-SHA-256 "
        "digest and the length) or `text` (the prompt itself; needed for content rules).",
    )
    stream_window_chars: int = Field(
        64,
        ge=8,
        le=4096,
        description="Output text held back while streaming, so a blocked word or PII split "
        "across two deltas is still caught (the longest match that can be caught across "
        "a split).",
    )

    @field_validator("blocklist")
    @classmethod
    def _words(cls, words: list[str]) -> list[str]:
        for word in words:
            if not word.strip() or len(word) > 256:
                raise ValueError(f"blocklist entry {word!r}: use 1-256 non-blank characters")
        return words

    @field_validator("blocklist_regex")
    @classmethod
    def _patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            reason = re2_error(pattern)
            if reason is not None:
                raise ValueError(f"pattern {pattern!r} is not valid RE2: {reason}")
        return patterns

    @field_validator("opa_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value
