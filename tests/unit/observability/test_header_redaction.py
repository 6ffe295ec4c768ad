"""Credential headers in the WebSocket handshake lines logged at debug are blanked."""

from __future__ import annotations

import logging

from inferflux.observability.logging import HeaderSecretRedactor


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("websockets.client", logging.DEBUG, __file__, 1, msg, args, None)


def test_credential_header_values_are_redacted():
    redactor = HeaderSecretRedactor()
    for name in ("Authorization", "authorization", "X-Api-Key", "Cookie"):
        record = _record("> %s: %s", name, "Bearer sk-canary")
        assert redactor.filter(record)
        assert record.getMessage() == f"> {name}: <redacted>"


def test_other_lines_are_left_alone():
    redactor = HeaderSecretRedactor()
    for record in (_record("< %s: %s", "Host", "127.0.0.1"), _record("token %s", "x")):
        before = record.getMessage()
        assert redactor.filter(record) and record.getMessage() == before
