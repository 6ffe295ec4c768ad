"""Audit events: one JSON line each, control characters escaped, text as keyed digests."""

from __future__ import annotations

import contextlib
import json
import logging

from inferflux.config.security_settings import AuditSettings
from inferflux.security.audit import AuditLog, make_audit_log
from inferflux.security.context import RequestContext, RequestRecord
from inferflux.security.digest import TextDigester
from inferflux.security.principal import Principal, Scope


def _log(tmp_path, *, raw=False):
    settings = AuditSettings(
        path=str(tmp_path / "audit.jsonl"), log_raw_text=raw, hmac_key="k" * 32
    )
    audit = make_audit_log(settings)
    assert audit is not None
    return audit, tmp_path / "audit.jsonl"


def test_control_characters_cannot_forge_a_line(tmp_path):
    audit, path = _log(tmp_path)
    forged = 'x"}\r\n{"event":"admin_change","principal":"root"}\u2028\x1b[31m'
    actor = Principal(
        subject=forged, kind="api_key", tenant="t\n2", scopes=frozenset({Scope.ADMIN})
    )
    audit.admin_change(actor, "api_key.create", forged, {"name": forged})
    audit.close()
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 2
    assert all(byte >= 0x20 for byte in lines[0])  # nothing raw below space, no CR/LF/ESC
    event = json.loads(lines[0])
    assert event["principal"]["subject"] == forged and event["target"] == forged


def test_prompts_are_keyed_digests_unless_raw_text_is_on(tmp_path):
    record = RequestRecord(prompt_text="my secret prompt", completion_text="an answer")
    context = RequestContext("r1", started_at=0.0, record=record)
    audit, path = _log(tmp_path)
    audit.request({"type": "http", "method": "POST", "state": {}}, context, 200, 0.5)
    audit.close()
    event = json.loads(path.read_text())
    digester = TextDigester(b"k" * 32)
    assert event["prompt"] == digester.digest("my secret prompt")
    assert "secret" not in path.read_text()
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    audit, path = _log(raw_dir, raw=True)
    audit.request({"type": "http", "method": "POST", "state": {}}, context, 200, 0.5)
    audit.close()
    assert json.loads(path.read_text())["prompt"] == "my secret prompt"


def test_digests_differ_by_key_and_random_keys_are_per_instance():
    assert TextDigester(b"a" * 32).digest("x") != TextDigester(b"b" * 32).digest("x")
    first, second = TextDigester(None), TextDigester(None)
    assert first.random_key and first.digest("x") != second.digest("x")


def test_no_sink_means_no_audit_log():
    assert make_audit_log(AuditSettings()) is None
    assert make_audit_log(AuditSettings(stdout=True, enabled=False)) is None


def test_audit_lines_never_reach_the_application_log(tmp_path, caplog):
    audit = AuditLog([logging.FileHandler(tmp_path / "a.jsonl")], TextDigester(b"k" * 32))
    with caplog.at_level(logging.DEBUG):
        audit.write({"event": "request"})
    audit.close()
    assert caplog.records == []


def test_a_line_the_disk_cannot_take_is_dropped_and_counted(capsys):
    # /dev/full: every write fails with ENOSPC, as on a full disk
    calls: list[int] = []
    full = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 - closed below
    audit = AuditLog(
        [logging.StreamHandler(full)], TextDigester(b"k" * 32), lambda: calls.append(1)
    )
    actor = Principal(subject="ops", kind="api_key", tenant="t", scopes=frozenset())
    for _ in range(3):
        audit.admin_change(actor, "api_key.create", "key_1", {})
    audit.close()
    with contextlib.suppress(OSError):  # a StreamHandler leaves its stream open
        full.close()
    assert audit.dropped == 3 and len(calls) == 3
    assert "Logging error" not in capsys.readouterr().err  # no traceback per dropped line
