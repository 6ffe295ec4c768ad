"""Process-wide logging: a stderr handler (text or JSON lines), an optional rotating JSON
log file, request ids and tenants, per-request sampling, prompt redaction.

Owns the root handlers that every InferFlux logger (and uvicorn's) writes through, the
`request_id_var` contextvar that the API's request-id middleware sets, `tenant_var` (set
by the authentication middleware once it exists), `RequestSampler` (the log level and the
share of requests whose info/debug lines are kept, server-wide or per tenant, changeable
at runtime with `update_log_policy`), and
`redact`, which keeps prompt and output text out of the logs unless
`observability.debug_prompts` is on, and `UrlSecretRedactor`, which strips the
credentials and the query string of every URL in every line (an OPA endpoint, a JWKS URL
or a Redis URL may carry a password or a token; `redact_url` does the same for one URL).
It does not own metrics (`observability/metrics.py`) or audit events (`security/`).

Call `configure_logging` once per process, before anything logs: the API process in
`inferflux serve`, each worker at start. Start uvicorn with `log_config=None` afterwards,
or its own dictConfig replaces the routing set up here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import logging.handlers
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

from inferflux.config.settings import ObservabilitySettings

# Set by the outermost (request-id) middleware for the duration of one request; read when a
# record is emitted, which happens synchronously in the task that logged it.
request_id_var: ContextVar[str | None] = ContextVar("inferflux_request_id", default=None)
# The tenant of the request being served, once authentication knows it (None before).
tenant_var: ContextVar[str | None] = ContextVar("inferflux_tenant", default=None)

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s:%(request_id_text)s %(message)s"
_HASH_CHARS = 12
# scheme://[userinfo@]rest[?query]: userinfo and query are what may carry a secret
_URL = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^\s/?#@\"'<>]*@)?"
    r"(?P<rest>[^\s?#\"'<>]*)(?P<query>\?(?:<redacted>|[^\s#\"'<>]*))?"
)
# Libraries that log every outbound request at INFO with its full URL (httpx: each OPA
# decision, each JWKS fetch): kept at WARNING unless the log level is debug.
_CHATTY_LOGGERS = ("httpx", "httpcore")


def _redacted(match: re.Match[str]) -> str:
    userinfo = "***@" if match["userinfo"] else ""
    query = "?<redacted>" if match["query"] and len(match["query"]) > 1 else ""
    return f"{match['scheme']}{userinfo}{match['rest']}{query}"


def redact_urls(text: str) -> str:
    """`text` with every URL's credentials (`user:password@`) and query string replaced:
    `http://user:secret@opa/v1/data?token=x` → `http://***@opa/v1/data?<redacted>`."""
    return _URL.sub(_redacted, text) if "://" in text else text


def redact_url(url: str) -> str:
    """One URL, safe to log (see `redact_urls`)."""
    return redact_urls(url)


class RequestIdFilter(logging.Filter):
    """Stamps `record.request_id` (None outside a request), `record.request_id_text` and
    `record.tenant` (None until authentication sets one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = request_id_var.get()
        record.request_id = request_id
        record.request_id_text = f" [{request_id}]" if request_id else ""
        record.tenant = tenant_var.get()
        return True


class AccessQueryRedactor(logging.Filter):
    """Blanks the query-string values in uvicorn's access lines (`/v1/models?api_key=...`
    → `/v1/models?api_key=<redacted>`): a client may put a credential in a URL, and the
    log must not keep it. Parameter names stay, for debugging."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.name != "uvicorn.access" or not isinstance(args, tuple) or len(args) < 3:
            return True
        path = args[2]
        if isinstance(path, str) and "?" in path:
            route, _, query = path.partition("?")
            names = (part.partition("=")[0] for part in query.split("&"))
            redacted = "&".join(f"{name}=<redacted>" for name in names if name)
            record.args = (*args[:2], f"{route}?{redacted}", *args[3:])
        return True


class UrlSecretRedactor(logging.Filter):
    """Rewrites a record whose message or traceback holds a URL with credentials or a
    query string (`redact_urls`), whichever library logged it. Runs on every handler."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_urls(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_urls(record.exc_text)
        return True


# A handshake header line as websockets (and uvicorn's WebSocket protocol) log them at
# debug: `> Authorization: Bearer ...` sent, `< authorization: ...` received.
_SECRET_HEADER_LINE = re.compile(
    r"^([<>] (?:authorization|proxy-authorization|x-api-key|api-key|cookie|set-cookie"
    r"|sec-websocket-protocol)\s*:\s*).*$",
    re.IGNORECASE,
)


class HeaderSecretRedactor(logging.Filter):
    """Blanks the value of a credential header in the handshake lines that websockets
    and uvicorn log at debug (`< authorization: Bearer sk-...` → `< authorization:
    <redacted>`), on the server's WebSocket routes and the router's WebSocket relay."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or record.msg[:2] not in ("< ", "> "):
            return True
        message = record.getMessage()
        redacted = _SECRET_HEADER_LINE.sub(r"\1<redacted>", message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


class RequestSampler(logging.Filter):
    """Applies the log level and the request sampling, server-wide or per tenant.

    A line of a tenant with its own `tenant_logging` entry is held to that tenant's level
    and sample rate; any other line to `log_level` and `log_sample_rate` (the root logger
    is set to the lowest level any tenant asks for, so this filter does the rest).
    Sampling keeps the info and debug lines of a fraction of requests: the decision
    hashes the request id, so a request's lines are kept or dropped together. Warnings,
    errors, and lines logged outside a request are always kept. Run after
    `RequestIdFilter`. `update` swaps the settings in place (PATCH /v1/admin/config).
    """

    def __init__(self, settings: ObservabilitySettings) -> None:
        super().__init__()
        self.update(settings)

    def update(self, settings: ObservabilitySettings) -> None:
        rate = settings.log_sample_rate
        default = (_LEVELS[settings.log_level], _threshold(rate))
        tenants = {
            name: (
                _LEVELS[entry.log_level or settings.log_level],
                _threshold(rate if entry.log_sample_rate is None else entry.log_sample_rate),
            )
            for name, entry in settings.tenant_logging.items()
        }
        self._default, self._tenants = default, tenants  # two stores; readers see either

    def filter(self, record: logging.LogRecord) -> bool:
        tenant = getattr(record, "tenant", None) or ""
        level, threshold = self._tenants.get(tenant, self._default)
        if record.levelno < level:
            return False
        if threshold is None or record.levelno >= logging.WARNING:
            return True
        request_id = getattr(record, "request_id", None)
        if not request_id:
            return True
        digest = hashlib.blake2b(request_id.encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") < threshold


def _threshold(rate: float) -> int | None:
    """The hash value below which a request's lines are kept; None keeps every line."""
    return None if rate >= 1.0 else int(rate * 2**32)


def lowest_level(settings: ObservabilitySettings) -> int:
    """The root logger's level: the lowest of `log_level` and every tenant's."""
    levels = [entry.log_level for entry in settings.tenant_logging.values() if entry.log_level]
    return min(_LEVELS[name] for name in (settings.log_level, *levels))


def update_log_policy(settings: ObservabilitySettings) -> None:
    """Apply new levels and sample rates to the handlers `configure_logging` installed
    (live tuning: PATCH /v1/admin/config). Handlers, formats and files stay as they are."""
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, _InferfluxHandler | _InferfluxFileHandler):
            for sampler in handler.filters:
                if isinstance(sampler, RequestSampler):
                    sampler.update(settings)
    _set_levels(settings)


def _set_levels(settings: ObservabilitySettings) -> None:
    level = lowest_level(settings)
    logging.getLogger().setLevel(level)
    chatty = _LEVELS[settings.log_level] <= logging.DEBUG
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if chatty else logging.WARNING)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC ISO 8601), level, logger, msg, request_id if set.

    Exceptions add `exc` (the formatted traceback); `stack_info` adds `stack`.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        tenant = getattr(record, "tenant", None)
        if tenant:
            entry["tenant"] = tenant
        if record.exc_text:
            entry["exc"] = record.exc_text
        elif record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class _InferfluxHandler(logging.StreamHandler):  # type: ignore[type-arg]  # TextIO stream
    """Marks the handler `configure_logging` installed, so a second call replaces it."""


class _InferfluxFileHandler(logging.handlers.RotatingFileHandler):
    """Marks the log-file handler `configure_logging` installed."""


def configure_logging(
    settings: ObservabilitySettings, *, stream: TextIO | None = None, file_suffix: str = ""
) -> None:
    """Install the one root handler on `stream` (default: sys.stderr) and set the level.

    Side effects: replaces handlers installed by an earlier call (idempotent), opens
    `settings.log_file` (JSON, rotated at `log_max_bytes`, appending) when set, sets the
    root level, and makes uvicorn's loggers propagate to root with no handlers of their own.
    `log_format="auto"` picks text when the stream is a TTY, JSON otherwise. Worker
    processes pass a `file_suffix` (`.worker-0`): rotation is not safe across processes,
    so each writes a file of its own.
    """
    out = sys.stderr if stream is None else stream
    handler = _InferfluxHandler(out)
    handlers: list[logging.Handler] = [handler]
    handler.setFormatter(_make_formatter(settings.log_format, out))
    if settings.log_file is not None:
        file_handler = _InferfluxFileHandler(
            settings.log_file + file_suffix,
            maxBytes=settings.log_max_bytes,
            backupCount=settings.log_backup_count,
            encoding="utf-8",
        )
        file_handler.setFormatter(JsonFormatter())
        handlers.append(file_handler)
    root = logging.getLogger()
    for old in [
        h for h in root.handlers if isinstance(h, _InferfluxHandler | _InferfluxFileHandler)
    ]:
        root.removeHandler(old)
        if isinstance(old, _InferfluxFileHandler):
            old.close()
    for new in handlers:
        new.addFilter(RequestIdFilter())
        new.addFilter(AccessQueryRedactor())
        new.addFilter(UrlSecretRedactor())
        new.addFilter(HeaderSecretRedactor())
        new.addFilter(RequestSampler(settings))
        root.addHandler(new)
    _set_levels(settings)
    for name in UVICORN_LOGGERS:
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
        uvicorn_logger.setLevel(logging.NOTSET)


def _make_formatter(log_format: str, stream: TextIO) -> logging.Formatter:
    use_json = log_format == "json" or (log_format == "auto" and not _is_tty(stream))
    if use_json:
        return JsonFormatter()
    return logging.Formatter(_TEXT_FORMAT)


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if callable(isatty) else False


def redact(text: str, debug: bool, *, key: bytes | None = None) -> str:
    """The text itself when `debug` is on; otherwise a short digest safe to log.

    The digest is `sha256:<12 hex> (<n> chars)`, or `hmac-sha256:<12 hex> (<n> chars)` with a
    `key` (keyed digests resist guessing short prompts from their hash). Equal texts give
    equal digests, so log lines about one prompt can still be correlated.
    """
    if debug:
        return text
    data = text.encode("utf-8", errors="surrogatepass")
    if key is None:
        return f"sha256:{hashlib.sha256(data).hexdigest()[:_HASH_CHARS]} ({len(text)} chars)"
    digest = hmac.new(key, data, hashlib.sha256).hexdigest()[:_HASH_CHARS]
    return f"hmac-sha256:{digest} ({len(text)} chars)"
