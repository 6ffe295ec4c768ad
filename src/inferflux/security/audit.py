"""The audit log: one JSON line per HTTP request and per admin change, to a rotated file
and/or stdout.

Owns `AuditLog` (the sink and the event shapes), `AuditMiddleware` (pure ASGI, outer to
authentication: it sees every request, authenticated or not, and writes the event when
the response has ended) and `make_audit_log`.

What an event holds: time, request id, principal (subject and kind, never a secret),
tenant, method, route template (never the raw path or query string), status, latency,
model, token counts, finish reason, policy decisions, the SHA-256 of each image (only
when there are images; never their bytes), and the prompt and output as HMAC-SHA-256
digests (`security/digest.py`; raw text only with `audit.log_raw_text`).
Every value goes through `json.dumps(ensure_ascii=True)`: CR, LF, other control
characters and non-ASCII text in user-controlled fields are escaped, so one event is
always exactly one line and cannot forge another. Headers, query strings and bodies are
never written.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import logging.handlers
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferflux.config.security_settings import AuditSettings
from inferflux.security.context import RequestContext, context_of
from inferflux.security.digest import TextDigester
from inferflux.security.principal import Principal

logger = logging.getLogger(__name__)
_ids = itertools.count()


class _LineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return str(record.msg)


class AuditLog:
    """Writes audit events. `write` is synchronous and quick (a buffered line per
    handler); safe from any thread (logging handlers lock). A line a sink cannot write
    is dropped and counted (`dropped`; `on_drop` is called too, e.g. a metric)."""

    def __init__(
        self,
        handlers: list[logging.Handler],
        digester: TextDigester,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        # NOTE: a private logger (not in logging's registry): nothing else writes to these
        # handlers, and audit lines never reach the application log.
        self._logger = logging.Logger(f"inferflux.audit.{next(_ids)}", logging.INFO)
        self._logger.propagate = False
        self.dropped = 0
        self._on_drop = on_drop
        for handler in handlers:
            handler.setFormatter(_LineFormatter())
            # NOTE: replaces logging's traceback to stderr per line it could not write
            handler.handleError = self._dropped  # type: ignore[method-assign]
            self._logger.addHandler(handler)
        self.digester = digester

    def _dropped(self, record: logging.LogRecord) -> None:
        """A line a sink could not write (disk full, read-only, closed stdout)."""
        del record
        self.dropped += 1
        if self._on_drop is not None:
            self._on_drop()

    def write(self, event: Mapping[str, object]) -> None:
        line = json.dumps(
            {"ts": _now(), **event}, ensure_ascii=True, separators=(",", ":"), default=str
        )
        self._logger.info(line)

    def request(self, scope: Scope, context: RequestContext, status: int, latency_s: float) -> None:
        digest = self.digester.render
        record, principal = context.record, context.principal
        images = {"images": list(record.image_sha256s)} if record.image_sha256s else {}
        self.write(
            {
                "event": "request",
                "request_id": context.request_id or None,
                "principal": _principal(principal),
                "tenant": principal.tenant if principal else None,
                "method": scope.get("method"),
                "route": context.route,
                "status": status,
                "latency_s": round(latency_s, 6),
                "model": record.model,
                "prompt_tokens": record.num_prompt_tokens,
                "completion_tokens": record.num_completion_tokens,
                "cached_tokens": record.num_cached_tokens,
                "finish_reason": record.finish_reason,
                "decisions": record.policy_decisions,
                "prompt": digest(record.prompt_text),
                "completion": digest(record.completion_text),
                **images,
            }
        )

    def admin_change(
        self, actor: Principal, action: str, target: str, details: Mapping[str, object]
    ) -> None:
        """An admin API change (`action` e.g. `api_key.create`, `target` the object's
        public id). `details` must hold no secret (digests and ids only)."""
        self.write(
            {
                "event": "admin_change",
                "principal": _principal(actor),
                "tenant": actor.tenant,
                "action": action,
                "target": target,
                "details": dict(details),
            }
        )

    def close(self) -> None:
        for handler in list(self._logger.handlers):
            self._logger.removeHandler(handler)
            # NOTE: a full disk fails the final flush too; those lines were counted already
            with contextlib.suppress(OSError):
                handler.close()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _principal(principal: Principal | None) -> dict[str, str] | None:
    if principal is None:
        return None
    return {"subject": principal.subject, "kind": principal.kind}


class AuditMiddleware:
    """Pure ASGI, outer to authentication. Asks the request's record to keep its text,
    and writes one event per request once its response has ended (or failed)."""

    def __init__(self, app: ASGIApp, audit: AuditLog, exclude_paths: frozenset[str]) -> None:
        self.app = app
        self.audit = audit
        self.exclude_paths = exclude_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "") in self.exclude_paths:
            await self.app(scope, receive, send)
            return
        context = context_of(scope)
        context.record.keep_text = True
        started_at = time.monotonic()
        status = 500  # until a response starts

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            self.audit.request(scope, context, status, time.monotonic() - started_at)


def make_audit_log(
    settings: AuditSettings, on_drop: Callable[[], None] | None = None
) -> AuditLog | None:
    """The audit log `settings` describe; None when it is off or has nowhere to write.
    `on_drop` is called for each line a sink could not write (dropped)."""
    if not settings.enabled or (settings.path is None and not settings.stdout):
        return None
    handlers: list[logging.Handler] = []
    if settings.path is not None:
        handlers.append(
            logging.handlers.RotatingFileHandler(
                settings.path,
                maxBytes=settings.max_bytes,
                backupCount=settings.backup_count,
                encoding="utf-8",
            )
        )
    if settings.stdout:
        handlers.append(logging.StreamHandler(sys.stdout))
    key = settings.hmac_key.get_secret_value().encode() if settings.hmac_key else None
    digester = TextDigester(key, raw=settings.log_raw_text)
    if digester.random_key:
        logger.warning(
            "audit.hmac_key is unset: prompt digests use a random per-process key and match "
            "only within this process (set INFERFLUX_AUDIT_HMAC_KEY to correlate across "
            "restarts and replicas)"
        )
    if settings.log_raw_text:
        logger.warning("audit.log_raw_text is on: prompts and outputs are written in clear")
    return AuditLog(handlers, digester, on_drop)
