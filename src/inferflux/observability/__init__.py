"""Observability: logging (text/JSON, request ids, prompt redaction); metrics live beside it."""

from inferflux.observability.logging import (
    JsonFormatter,
    configure_logging,
    redact,
    request_id_var,
)

__all__ = ["JsonFormatter", "configure_logging", "redact", "request_id_var"]
