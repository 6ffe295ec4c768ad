"""GET /metrics: the Prometheus text exposition of the app's registry.

The metrics themselves live in observability/metrics.py; `api/telemetry.py` feeds them.
Public by default (`observability.metrics.public`): a scraper inside the cluster needs no
credentials. With `public: false` the route needs the `read` scope (`api/app.py` and the
public paths of `api/security_layer.py` read the setting). With
`observability.metrics.enabled: false` the route answers 404 and nothing is recorded.
"""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import generate_latest
from starlette.requests import Request
from starlette.responses import Response

from inferflux.api.state import TelemetryDep
from inferflux.config.settings import Settings
from inferflux.errors import NotFound

router = APIRouter(tags=["ops"])

# The classic text format, which every Prometheus version reads (metric names here are all
# legacy-valid, so it loses nothing against prometheus_client's newer 1.0.0 label).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def is_public(settings: Settings) -> bool:
    """True when /metrics is served without credentials (for the auth middleware)."""
    return settings.observability.metrics.public


@router.get("/metrics", response_class=Response)
async def metrics(request: Request, telemetry: TelemetryDep) -> Response:
    """Prometheus text exposition (version 0.0.4). docs/observability.md lists every metric."""
    if telemetry.metrics is None:
        raise NotFound("metrics are off on this server (observability.metrics.enabled)")
    body = generate_latest(telemetry.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE)
