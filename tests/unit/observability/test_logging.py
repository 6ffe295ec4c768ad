"""configure_logging (text/JSON/auto, levels, uvicorn routing), request ids, redact."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re

import pytest

from inferflux.config.settings import ObservabilitySettings
from inferflux.observability import configure_logging, redact, request_id_var, tenant_var
from inferflux.observability.logging import UVICORN_LOGGERS, update_log_policy


class _TtyStream(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging():
    """Put the root and uvicorn loggers back as they were (pytest's own handlers included)."""
    names = ["", *UVICORN_LOGGERS, "httpx", "httpcore"]
    saved = {}
    for name in names:
        lg = logging.getLogger(name)
        saved[name] = (list(lg.handlers), lg.level, lg.propagate)
    yield
    for name, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(name)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


def _configure(stream: io.StringIO, **kwargs) -> None:
    configure_logging(ObservabilitySettings(**kwargs), stream=stream)


def _json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_line_has_required_fields_and_formats_args():
    out = io.StringIO()
    _configure(out, log_format="json")
    logging.getLogger("inferflux.test").info("admitted %d requests", 3)
    [entry] = _json_lines(out)
    assert entry["level"] == "info"
    assert entry["logger"] == "inferflux.test"
    assert entry["msg"] == "admitted 3 requests"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", entry["ts"])
    assert "request_id" not in entry


def test_json_line_carries_request_id_from_contextvar():
    out = io.StringIO()
    _configure(out, log_format="json")
    token = request_id_var.set("req-123")
    try:
        logging.getLogger("inferflux.test").warning("inside")
    finally:
        request_id_var.reset(token)
    logging.getLogger("inferflux.test").warning("outside")
    inside, outside = _json_lines(out)
    assert inside["request_id"] == "req-123"
    assert "request_id" not in outside


async def test_request_id_is_per_task():
    out = io.StringIO()
    _configure(out, log_format="json")

    async def handle(request_id: str) -> None:
        request_id_var.set(request_id)
        await asyncio.sleep(0)
        logging.getLogger("inferflux.test").info("done %s", request_id)

    await asyncio.gather(handle("a"), handle("b"))
    entries = _json_lines(out)
    assert {(e["msg"], e["request_id"]) for e in entries} == {("done a", "a"), ("done b", "b")}
    assert request_id_var.get() is None


def test_json_line_includes_exception_and_escapes_newlines():
    out = io.StringIO()
    _configure(out, log_format="json")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("inferflux.test").exception("failed\nhere")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "error"
    assert entry["msg"] == "failed\nhere"
    assert "ValueError: boom" in entry["exc"]


def test_text_format_shows_level_logger_message_and_request_id():
    out = io.StringIO()
    _configure(out, log_format="text")
    token = request_id_var.set("req-9")
    try:
        logging.getLogger("inferflux.test").info("hello %s", "world")
    finally:
        request_id_var.reset(token)
    line = out.getvalue().strip()
    assert "INFO" in line
    assert "inferflux.test: [req-9] hello world" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


@pytest.mark.parametrize(("stream", "is_json"), [(io.StringIO(), True), (_TtyStream(), False)])
def test_auto_picks_text_on_a_tty_and_json_otherwise(stream, is_json):
    _configure(stream, log_format="auto")
    logging.getLogger("inferflux.test").info("x")
    line = stream.getvalue().strip()
    assert line.startswith("{") is is_json


def test_level_filters_lower_records():
    out = io.StringIO()
    _configure(out, log_format="json", log_level="warning")
    log = logging.getLogger("inferflux.test")
    log.info("hidden")
    log.debug("hidden")
    log.warning("shown")
    assert [e["msg"] for e in _json_lines(out)] == ["shown"]


def test_debug_level_lets_debug_through():
    out = io.StringIO()
    _configure(out, log_format="json", log_level="debug")
    logging.getLogger("inferflux.test").debug("details")
    assert [e["level"] for e in _json_lines(out)] == ["debug"]


def test_configure_twice_replaces_its_handler():
    first, second = io.StringIO(), io.StringIO()
    _configure(first, log_format="json")
    _configure(second, log_format="json")
    logging.getLogger("inferflux.test").info("once")
    assert first.getvalue() == ""
    assert len(_json_lines(second)) == 1


def test_uvicorn_loggers_go_through_the_same_handler():
    stray = logging.StreamHandler(io.StringIO())
    logging.getLogger("uvicorn.error").addHandler(stray)
    logging.getLogger("uvicorn.access").propagate = False
    logging.getLogger("uvicorn.access").setLevel(logging.CRITICAL)
    out = io.StringIO()
    _configure(out, log_format="json")
    logging.getLogger("uvicorn.error").info("Started server process")
    args = ("127.0.0.1:5000", "GET", "/healthz", "1.1", 200)
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', *args)
    entries = _json_lines(out)
    assert [e["logger"] for e in entries] == ["uvicorn.error", "uvicorn.access"]
    assert entries[1]["msg"] == '127.0.0.1:5000 - "GET /healthz HTTP/1.1" 200'
    assert stray not in logging.getLogger("uvicorn.error").handlers


def test_redact_returns_text_in_debug_mode():
    assert redact("my secret prompt", debug=True) == "my secret prompt"


def test_redact_hashes_text_otherwise():
    text = "my secret prompt"
    redacted = redact(text, debug=False)
    assert re.fullmatch(r"sha256:[0-9a-f]{12} \(16 chars\)", redacted)
    assert "secret" not in redacted
    assert redacted == redact(text, debug=False)
    assert redacted != redact(text + "!", debug=False)


def test_redact_with_key_is_keyed():
    text = "my secret prompt"
    keyed = redact(text, debug=False, key=b"k1")
    assert re.fullmatch(r"hmac-sha256:[0-9a-f]{12} \(16 chars\)", keyed)
    assert keyed != redact(text, debug=False, key=b"k2")
    assert keyed.split(":")[1] != redact(text, debug=False).split(":")[1]


@pytest.mark.parametrize("text", ["", "héllo 世界 🙂", "\ud800 lone surrogate"])
def test_redact_handles_any_text(text):
    assert redact(text, debug=False).endswith(f"({len(text)} chars)")


def test_json_line_carries_the_tenant_when_known():
    out = io.StringIO()
    _configure(out, log_format="json")
    token = tenant_var.set("acme")
    try:
        logging.getLogger("inferflux.test").info("for a tenant")
    finally:
        tenant_var.reset(token)
    logging.getLogger("inferflux.test").info("no tenant")
    with_tenant, without = _json_lines(out)
    assert with_tenant["tenant"] == "acme"
    assert "tenant" not in without


def _log_in_requests(request_ids: list[str]) -> None:
    log = logging.getLogger("inferflux.test")
    for request_id in request_ids:
        token = request_id_var.set(request_id)
        try:
            log.info("one %s", request_id)
            log.debug("two %s", request_id)
            log.warning("warn %s", request_id)
        finally:
            request_id_var.reset(token)


def test_sampling_keeps_whole_requests_and_every_warning():
    out = io.StringIO()
    _configure(out, log_format="json", log_level="debug", log_sample_rate=0.5)
    request_ids = [f"req-{i}" for i in range(200)]
    _log_in_requests(request_ids)
    logging.getLogger("inferflux.test").info("outside any request")
    entries = _json_lines(out)
    assert sum(e["level"] == "warning" for e in entries) == 200
    kept = {e["request_id"] for e in entries if e["level"] == "info" and "request_id" in e}
    debug_kept = {e["request_id"] for e in entries if e["level"] == "debug"}
    assert kept == debug_kept  # a request's lines are kept or dropped together
    assert 40 < len(kept) < 160  # about half (the hash is deterministic, not random)
    assert any(e["msg"] == "outside any request" for e in entries)


def test_sampling_rate_zero_keeps_only_warnings_in_requests():
    out = io.StringIO()
    _configure(out, log_format="json", log_sample_rate=0.0)
    _log_in_requests(["a", "b"])
    assert [e["level"] for e in _json_lines(out)] == ["warning", "warning"]


def test_log_file_is_json_and_rotates(tmp_path):
    path = tmp_path / "inferflux.log"
    out = io.StringIO()
    settings = ObservabilitySettings(
        log_format="text", log_file=str(path), log_max_bytes=2048, log_backup_count=2
    )
    configure_logging(settings, stream=out)
    log = logging.getLogger("inferflux.test")
    for i in range(100):
        log.info("line %d %s", i, "x" * 40)
    configure_logging(ObservabilitySettings(), stream=out)  # closes the file handler
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["inferflux.log", "inferflux.log.1", "inferflux.log.2"]
    for name in files:
        for line in (tmp_path / name).read_text().splitlines():
            assert json.loads(line)["logger"] == "inferflux.test"
    assert not out.getvalue().startswith("{")  # the stream keeps its own (text) format


def test_worker_log_files_get_a_suffix(tmp_path):
    path = tmp_path / "inferflux.log"
    settings = ObservabilitySettings(log_file=str(path))
    configure_logging(settings, stream=io.StringIO(), file_suffix=".worker-3")
    logging.getLogger("inferflux.test").warning("from a worker")
    configure_logging(ObservabilitySettings(), stream=io.StringIO())
    assert [p.name for p in tmp_path.iterdir()] == ["inferflux.log.worker-3"]


def test_urls_lose_their_credentials_and_query_in_every_line():
    """An outbound URL with a password or a token (OPA, JWKS, Redis) never reaches a log
    line, whoever logs it: httpx's own INFO lines are quiet unless debug, and anything that
    still names the URL, in the message or in a traceback, is rewritten."""
    out = io.StringIO()
    _configure(out, log_format="json")
    secret_url = "http://opa-user:opa-secret@127.0.0.1:8181/v1/data/allow?token=opa-token"
    logging.getLogger("httpx").info("HTTP Request: POST %s", secret_url)
    logging.getLogger("inferflux.test").warning("calling %s", secret_url)
    try:
        raise ConnectionError(f"redis://:redis-secret@127.0.0.1:6390/0 refused ({secret_url})")
    except ConnectionError:
        logging.getLogger("inferflux.test").exception("redis down")
    text = out.getvalue()
    for secret in ("opa-secret", "opa-token", "redis-secret", "opa-user"):
        assert secret not in text
    entries = _json_lines(out)
    assert [e["logger"] for e in entries] == ["inferflux.test", "inferflux.test"]  # httpx quiet
    assert entries[0]["msg"] == "calling http://***@127.0.0.1:8181/v1/data/allow?<redacted>"
    assert "redis://***@127.0.0.1:6390/0" in entries[1]["exc"]


def test_httpx_speaks_at_debug():
    out = io.StringIO()
    _configure(out, log_format="json", log_level="debug")
    logging.getLogger("httpx").info("HTTP Request: GET https://idp.example/jwks?key=k1")
    [entry] = _json_lines(out)
    assert entry["msg"] == "HTTP Request: GET https://idp.example/jwks?<redacted>"


def _log_as(tenant: str | None, request_id: str) -> None:
    log = logging.getLogger("inferflux.test")
    tokens = (tenant_var.set(tenant), request_id_var.set(request_id))
    try:
        log.debug("debug %s", request_id)
        log.info("info %s", request_id)
        log.warning("warn %s", request_id)
    finally:
        tenant_var.reset(tokens[0])
        request_id_var.reset(tokens[1])


def test_a_tenant_can_log_at_a_level_of_its_own():
    out = io.StringIO()
    tenants = {"acme": {"log_level": "debug"}, "quiet": {"log_level": "error"}}
    _configure(out, log_format="json", log_level="warning", tenant_logging=tenants)
    for tenant in ("acme", "globex", "quiet", None):
        _log_as(tenant, f"req-{tenant}")
    logging.getLogger("inferflux.test").info("outside any request")
    levels = {(e.get("tenant"), e["level"]) for e in _json_lines(out)}
    assert levels == {("acme", "debug"), ("acme", "info"), ("acme", "warning"),
                      ("globex", "warning"), (None, "warning")}  # fmt: skip


def test_update_log_policy_changes_levels_and_sampling_in_place():
    out = io.StringIO()
    _configure(out, log_format="json")
    _log_as("acme", "before")
    update_log_policy(
        ObservabilitySettings(
            log_level="warning", tenant_logging={"acme": {"log_sample_rate": 0.0}}
        )
    )
    _log_as("acme", "after-acme")
    _log_as("globex", "after-globex")
    update_log_policy(ObservabilitySettings(log_level="debug"))
    _log_as("globex", "debug-globex")
    seen = [(e["request_id"], e["level"]) for e in _json_lines(out)]
    assert seen == [
        ("before", "info"), ("before", "warning"),
        ("after-acme", "warning"),  # sampled out below warning, and at warning anyway
        ("after-globex", "warning"),
        ("debug-globex", "debug"), ("debug-globex", "info"), ("debug-globex", "warning"),
    ]  # fmt: skip
