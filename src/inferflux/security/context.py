"""`RequestContext`: one HTTP request as every layer sees it, and `RequestRecord`, what it did.

The outermost middleware creates the context (request id, arrival time) and keeps it on
the ASGI scope (`context_of(scope)`); the security middleware fill it in: the audit
middleware asks for the request's text (`record.keep_text`), authentication sets the
`principal`, rate limiting its `rate_limit` status. Routes take it as a dependency and pass
it on explicitly: to the generation service and from there to the engine wrappers (token
limits, guardrails, observation), which add to its `record`. When the response has ended
the audit middleware writes the record out, and the telemetry middleware counts its
streamed tokens.

Nothing here is a ContextVar: code that needs the request gets it as an argument. The one
ambient exception is the logging filter's request id and tenant (`observability/
logging.py`): a log line can be emitted from anywhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.types import Scope as AsgiScope

from inferflux.security.principal import Principal

if TYPE_CHECKING:  # NOTE: rate_limit's middleware imports this module
    from inferflux.security.rate_limit.service import RateLimitStatus

_STATE_KEY = "inferflux_context"
UNMATCHED_ROUTE = "unmatched"  # the route of a request no route served (404, 413)


@dataclass(slots=True)
class RequestRecord:
    """What one request did, filled in as it runs (one event loop; no locks).

    Counters are always kept (metrics read them). Text fields are kept only while
    `keep_text` is on (the audit log asks for it) and hold raw text in memory only: the
    audit log writes their keyed digests unless `audit.log_raw_text` is on.
    """

    keep_text: bool = False
    model: str | None = None
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_cached_tokens: int = 0
    num_cache_hits: int = 0  # generations whose prompt reused prefix-cache KV
    finish_reason: str | None = None  # of the last generation that finished
    prompt_text: str | None = None  # hashed (HMAC) unless audit debug is on
    completion_text: str | None = None  # every generation's released text, in order
    policy_decisions: list[str] = field(default_factory=list)  # "guardrail:pii:redact", ...
    image_sha256s: list[str] = field(default_factory=list)  # the prompt's images, never bytes

    def add_decision(self, decision: str) -> None:
        """Record a policy decision once (n choices of one request decide alike)."""
        if decision not in self.policy_decisions:
            self.policy_decisions.append(decision)

    def add_completion(self, text: str) -> None:
        """Append released output text (kept only while `keep_text`)."""
        if self.keep_text:
            self.completion_text = (self.completion_text or "") + text

    def set_prompt(self, text: str) -> None:
        """The prompt as the engine gets it (kept only while `keep_text`)."""
        if self.keep_text:
            self.prompt_text = text


@dataclass(slots=True, eq=False)
class RequestContext:
    """One HTTP request. Created once per request by the outermost middleware; mutable,
    touched only by the request's own tasks on the event loop."""

    request_id: str
    started_at: float  # time.monotonic() at arrival: TTFT and latency count from here
    principal: Principal | None = None  # set by authentication
    rate_limit: RateLimitStatus | None = None  # set by the rate-limit middleware
    record: RequestRecord = field(default_factory=RequestRecord)
    scope: AsgiScope | None = field(default=None, repr=False)

    @property
    def caller(self) -> Principal:
        """The authenticated principal. Raises LookupError when authentication never ran:
        a route outside the middleware stack is a bug, never a reason to allow."""
        if self.principal is None:
            raise LookupError("no principal on this request: the auth middleware did not run")
        return self.principal

    @property
    def tenant(self) -> str | None:
        return self.principal.tenant if self.principal is not None else None

    @property
    def route(self) -> str:
        """The route template that serves the request (`/v1/chat/completions`), once the
        router matched one; `unmatched` before or without a match."""
        path = getattr(self.scope.get("route"), "path", None) if self.scope else None
        return path if isinstance(path, str) else UNMATCHED_ROUTE


def context_of(scope: AsgiScope) -> RequestContext:
    """The request's context, created on first use (a middleware tested alone, without the
    request-id middleware outside it, still gets one)."""
    state = scope.setdefault("state", {})
    context = state.get(_STATE_KEY)
    if not isinstance(context, RequestContext):
        request_id = state.get("request_id")
        context = RequestContext(
            request_id=request_id if isinstance(request_id, str) else "",
            started_at=time.monotonic(),
            scope=scope,
        )
        state[_STATE_KEY] = context
    return context


def open_context(scope: AsgiScope, request_id: str) -> RequestContext:
    """The request's context under its id: a new one, or the one a layer outside the app
    already made (it keeps that layer's arrival time). The request-id middleware calls
    this once per request."""
    context = context_of(scope)
    context.request_id = request_id
    return context
