"""`RequestRecord`: what one request did, filled in as it runs, read by the audit log.

The audit middleware (outermost of the security stack) puts a fresh record on the ASGI
scope and in `request_record_var`; routes, the rate limiter, the engine wrapper and
guardrails add to it (`get_request_record(scope)`, or `current_request_record()` where no
scope is at hand); when the response ends the audit middleware writes it out with status
and latency. Text fields hold raw text in memory only: the audit log writes their keyed
digests unless `audit.log_raw_text` is on.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from starlette.types import Scope as AsgiScope

_STATE_KEY = "request_record"


@dataclass(slots=True)
class RequestRecord:
    route: str = ""
    model: str | None = None
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None  # of the last generation that finished
    prompt_text: str | None = None  # hashed (HMAC) unless audit debug is on
    completion_text: str | None = None  # every generation's released text, in order
    policy_decisions: list[str] = field(default_factory=list)  # "guardrail:pii:redact", ...

    def add_decision(self, decision: str) -> None:
        """Record a policy decision once (n choices of one request decide alike)."""
        if decision not in self.policy_decisions:
            self.policy_decisions.append(decision)

    def add_completion(self, text: str) -> None:
        self.completion_text = text if self.completion_text is None else self.completion_text + text


request_record_var: ContextVar[RequestRecord | None] = ContextVar(
    "inferflux_request_record", default=None
)


def attach_request_record(scope: AsgiScope) -> RequestRecord:
    record = RequestRecord()
    scope.setdefault("state", {})[_STATE_KEY] = record
    return record


def get_request_record(scope: AsgiScope) -> RequestRecord | None:
    """The request's record, or None when no audit middleware runs (audit off)."""
    record = scope.get("state", {}).get(_STATE_KEY)
    return record if isinstance(record, RequestRecord) else None


# The ASGI scope of the request this task serves (set by the audit and rate-limit
# middleware): the router fills in its matched route, which `current_route` reads.
request_scope_var: ContextVar[AsgiScope | None] = ContextVar(
    "inferflux_request_scope", default=None
)


def current_route() -> str:
    """The route template serving the current request (`/v1/chat/completions`), or ""."""
    scope = request_scope_var.get()
    path = getattr(scope.get("route"), "path", None) if scope is not None else None
    return path if isinstance(path, str) else ""


def current_request_record() -> RequestRecord | None:
    """The record of the request this task serves (None when audit is off)."""
    return request_record_var.get()
