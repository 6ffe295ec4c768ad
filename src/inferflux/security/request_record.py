"""`RequestRecord`: what one request did, filled in as it runs, read by the audit log.

The audit middleware (outermost of the security stack) puts a fresh record on the ASGI
scope; routes, the rate limiter and guardrails add to it (`get_request_record`); when the
response ends the audit middleware writes it out with status and latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.types import Scope as AsgiScope

_STATE_KEY = "request_record"


@dataclass(slots=True)
class RequestRecord:
    route: str = ""
    model: str | None = None
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    finish_reason: str | None = None
    prompt_text: str | None = None  # hashed (HMAC) unless audit debug is on
    completion_text: str | None = None
    policy_decisions: list[str] = field(default_factory=list)  # "guardrail:pii:redact", ...


def attach_request_record(scope: AsgiScope) -> RequestRecord:
    record = RequestRecord()
    scope.setdefault("state", {})[_STATE_KEY] = record
    return record


def get_request_record(scope: AsgiScope) -> RequestRecord | None:
    """The request's record, or None when no audit middleware runs (audit off)."""
    record = scope.get("state", {}).get(_STATE_KEY)
    return record if isinstance(record, RequestRecord) else None
