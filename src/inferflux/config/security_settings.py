"""Settings sections of the security layer's limits and controls: `redis`, `rate_limit`,
`audit`, `guardrails` (issue 6 part B). `config/settings.py` puts them into `Settings`.

Authentication, TLS and the policy store have sections of their own (part A). Secrets
(`audit.hmac_key`, a password inside `redis.url`) are `SecretStr`: printed as `**********`,
and the loader never quotes them in an error.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from inferflux.config.policy_schema import GuardrailRules, LimitFields, Name


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RedisSettings(_Section):
    url: SecretStr | None = Field(
        None,
        description="Redis for state shared across replicas (rate-limit counters, policy "
        "replication), e.g. "
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
    policy_sync: bool = Field(
        True,
        description="With url set: replicate admin policy changes (keys, tenants, limits, "
        "tiers, guardrails) to every replica that shares this Redis and namespace, in "
        "version order. Off: each replica keeps its own policy.",
    )
    policy_sync_interval_s: float = Field(
        2.0,
        ge=0.1,
        le=300,
        description="How often each replica checks the policy version in Redis, as a "
        "backstop to pub/sub (catch-up after a Redis restart or a dropped subscription), "
        "and how long it waits before reconnecting after a failure.",
    )
    config_sync: bool = Field(
        True,
        description="With url set: replicate live config changes (PATCH /v1/admin/config) "
        "to every replica that shares this Redis and namespace; a replica that starts "
        "takes the cluster's live values. Off: each replica keeps its own.",
    )
    model_sync: bool = Field(
        True,
        description="With url set: replicate the models loaded, unloaded, swapped or made "
        "the default through POST /v1/admin/models to every replica that shares this Redis "
        "and namespace (each loads the same entries; an hf:// path downloads there). A "
        "replica that cannot load one keeps serving and lists it in /server/stats "
        "(model_replication.failed). Off: each replica keeps its own models.",
    )
    policy_namespace: str = Field(
        "inferflux:policy",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9:._-]+$",
        description="Prefix of the policy replication keys and channel in Redis (the live "
        "config's are under `<prefix>:config`): replicas that act as one service share "
        "it; another cluster on the same Redis uses another.",
    )

    @field_validator("url")
    @classmethod
    def _redis_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value


class RateLimitSettings(_Section, LimitFields):
    """`requests_per_minute`, `tokens_per_minute`, `max_concurrent` here are the defaults
    of each key (or subject) without limits of its own, its tenant's or its tier's."""

    enabled: bool = Field(
        True,
        description="Enforce the limits of the policy (keys, tenants, tiers, the defaults "
        "below). With every limit unset nothing is limited either way.",
    )
    tiers: dict[Name, LimitFields] = Field(
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


class GuardrailSettings(_Section, GuardrailRules):
    """The rules (`GuardrailRules`: blocklist, blocklist_regex, pii_action, opa_endpoint,
    opa_fail_open) seed the policy; the admin API changes them at runtime. The rest is
    how they run."""

    opa_timeout_s: float = Field(
        0.2, gt=0, le=30, description="Timeout of one OPA decision request."
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
