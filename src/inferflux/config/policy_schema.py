"""The one declaration of each policy concept that both the config file and the admin API
take: names (`Name`), rate limits (`LimitFields`) and guardrail rules (`GuardrailRules`),
with their fields, bounds, descriptions and checks.

The config sections (`auth_settings.py`, `security_settings.py`) and the admin API's
bodies (`api/admin/protocol.py`) derive from these models and add only what is theirs (a
key's secret, OPA's timeout; strict JSON types at the HTTP edge), so a bound or a check
cannot drift between the two paths again. Blocklist patterns are checked with RE2, the
engine that runs them: a pattern RE2 cannot run is refused on both paths (an admin body
with one is a 422 naming it, a config file with one does not start), so no admin typo can
make every generation fail. The policy's runtime values (`security/policy.py`) are plain
immutable data built from these models; they declare no bounds.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

import re2
from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]  # a tenant, tier, key id, role
PiiAction = Literal["off", "redact", "block"]

MAX_REQUESTS_PER_MINUTE = 10_000_000
MAX_TOKENS_PER_MINUTE = 10_000_000_000
MAX_CONCURRENT = 100_000
MAX_BLOCKLIST = 10_000
MAX_WORD_CHARS = 256
MAX_REGEXES = 1_000
MAX_PATTERN_CHARS = 1024
MAX_URL_CHARS = 2048
# The pydantic error type of a well-formed value the policy cannot use: the admin API
# answers it with a 422 (api/errors.py), the config loader like any invalid value.
UNUSABLE = "unusable_value"


class LimitFields(BaseModel):
    """Limits of one key, tenant or tier, or the defaults. Unset (null) = unlimited."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUESTS_PER_MINUTE,
        description="Requests per minute (burst: a whole minute's). Unset: no limit.",
    )
    tokens_per_minute: int | None = Field(
        None,
        ge=1,
        le=MAX_TOKENS_PER_MINUTE,
        description="Prompt plus completion tokens per minute. Unset: no limit.",
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        le=MAX_CONCURRENT,
        description="Requests being answered at once. Unset: no limit.",
    )


def re2_error(pattern: str) -> str | None:
    """None when RE2 (the guardrails' regex engine: linear time, so no backreferences,
    lookaround, `\\Z`...) compiles `pattern`, else why not."""
    options = re2.Options()
    options.log_errors = False
    try:
        re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        return reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
    return None


def _word(word: str) -> str:
    if not word.strip():
        raise ValueError("a blocklist entry must hold a non-blank character")
    return word


def _re2(pattern: str) -> str:
    reason = re2_error(pattern)
    if reason is not None:
        raise PydanticCustomError(
            UNUSABLE,
            "the pattern {pattern} is not valid RE2, the guardrails' regex engine "
            "({reason}); rewrite it without backreferences or lookaround",
            {"pattern": repr(pattern), "reason": reason},
        )
    return pattern


def _http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return url


BlockWord = Annotated[str, Field(min_length=1, max_length=MAX_WORD_CHARS), AfterValidator(_word)]
Re2Pattern = Annotated[str, Field(min_length=1, max_length=MAX_PATTERN_CHARS), AfterValidator(_re2)]
HttpUrl = Annotated[str, Field(max_length=MAX_URL_CHARS), AfterValidator(_http_url)]


class GuardrailRules(BaseModel):
    """The guardrail rules an operator sets in the config file and the admin API changes
    at runtime (PUT /v1/admin/guardrails replaces them in the policy store)."""

    model_config = ConfigDict(extra="forbid")

    blocklist: list[BlockWord] = Field(
        default_factory=list,
        max_length=MAX_BLOCKLIST,
        description="Words and phrases refused in prompts and outputs (case-insensitive, "
        "whole words; 1-256 characters, not blank).",
    )
    blocklist_regex: list[Re2Pattern] = Field(
        default_factory=list,
        max_length=MAX_REGEXES,
        description="Patterns refused in prompts and outputs (RE2 syntax: linear time, no "
        "backreferences or lookaround).",
    )
    pii_action: PiiAction = Field(
        "off",
        validation_alias=AliasChoices("pii_action", "pii"),
        description="Emails, phone numbers, card numbers (Luhn) and IBANs (mod 97): `redact` "
        "replaces them with [REDACTED_<KIND>] in prompts and outputs, `block` refuses them. "
        "`pii` is accepted as an older name.",
    )
    opa_endpoint: HttpUrl | None = Field(
        None,
        description="OPA Data API URL of a decision, e.g. "
        "`http://127.0.0.1:8181/v1/data/inferflux/allow`. Unset: no OPA decision.",
    )
    opa_fail_open: bool = Field(
        False,
        description="Allow requests when OPA is unreachable or answers nonsense. Default: "
        "refuse them with 503 policy_unavailable (fail closed).",
    )
