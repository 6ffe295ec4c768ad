"""GET /v1/admin/usage: requests and tokens per API key, tenant and model over a window.

Reads the API process's `UsageLedger` (observability/usage.py: per-minute buckets over the
last 24 h, bounded rows). `window` is one of `WINDOWS`; `group_by` a comma-separated
subset of key, tenant, model (default all three). The answer also holds the per-minute
totals of the window (`series`) and the server's clock (`now`), for a chart.
Admin-only, like the rest of /v1/admin.
"""

from __future__ import annotations

import time

from fastapi import APIRouter

from inferflux.api.state import TelemetryDep
from inferflux.errors import InvalidRequest
from inferflux.observability.usage import UsageCounts

router = APIRouter(prefix="/v1/admin", tags=["admin"])

WINDOWS = {"5m": 300.0, "1h": 3600.0, "24h": 86400.0}
_FIELDS = ("key", "tenant", "model")


def _counts_json(counts: UsageCounts) -> dict[str, int]:
    return {
        "requests": counts.num_requests,
        "prompt_tokens": counts.num_prompt_tokens,
        "completion_tokens": counts.num_completion_tokens,
        "total_tokens": counts.num_prompt_tokens + counts.num_completion_tokens,
    }


@router.get("/usage")
async def get_usage(
    telemetry: TelemetryDep, window: str = "1h", group_by: str = "key,tenant,model"
) -> dict[str, object]:
    """Usage of the last `window` (5m, 1h, 24h) grouped by `group_by`, most tokens first,
    and its per-minute totals. Counts this API process only."""
    if window not in WINDOWS:
        raise InvalidRequest(
            f"window {window!r} is not one of {', '.join(WINDOWS)}", param="window"
        )
    fields = tuple(f.strip() for f in group_by.split(",") if f.strip())
    unknown = [f for f in fields if f not in _FIELDS]
    if unknown or not fields:
        raise InvalidRequest(
            f"group_by {group_by!r}: name one or more of {', '.join(_FIELDS)}", param="group_by"
        )
    window_s = WINDOWS[window]
    rows = telemetry.usage.query(window_s, fields)
    return {
        "object": "usage",
        "window": window,
        "now": int(time.time()),
        "group_by": list(fields),
        "data": [
            {"key": r.key, "tenant": r.tenant, "model": r.model, **_counts_json(r.counts)}
            for r in rows
        ],
        "series": [
            {"minute": minute, **_counts_json(counts)}
            for minute, counts in telemetry.usage.series(window_s)
        ],
    }
