"""Observability: logging (text/JSON, request ids, sampling, redaction), the Prometheus
metrics registry (`metrics.py`), tracing setup (`tracing.py`), throughput windows."""

from inferflux.observability.logging import (
    JsonFormatter,
    configure_logging,
    redact,
    redact_url,
    redact_urls,
    request_id_var,
    tenant_var,
)

__all__ = [
    "JsonFormatter",
    "configure_logging",
    "redact",
    "redact_url",
    "redact_urls",
    "request_id_var",
    "tenant_var",
]
