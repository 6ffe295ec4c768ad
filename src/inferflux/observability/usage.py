"""`UsageLedger`: requests and tokens per API key, tenant and model, over recent windows.

Owns the in-memory aggregate behind `GET /v1/admin/usage` (and the console's Usage
page): a ring of per-minute buckets covering the last `horizon_s` (24 h by default), each
mapping (key, tenant, model) to request and token counts. Memory is bounded twice: by the
number of buckets, and by `max_rows` distinct (key, tenant, model) rows per bucket (past
it, a minute's further rows are summed under the key `other`). Does not own: where
requests are counted (`api/telemetry.py` adds one row per finished request that reached a
model), nor metrics (Prometheus labels never carry a key: STYLE.md §10).

One process, one event loop: no locks. Counts are this API process's only; across
replicas, sum the replicas' answers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

BUCKET_S = 60.0
OTHER = "other"


@dataclass(slots=True)
class UsageCounts:
    """Counts of one row (or a group of rows)."""

    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0

    def add(self, other: UsageCounts) -> None:
        self.num_requests += other.num_requests
        self.num_prompt_tokens += other.num_prompt_tokens
        self.num_completion_tokens += other.num_completion_tokens


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One group's counts in a window: `key`, `tenant`, `model` (None where grouped away)."""

    key: str | None
    tenant: str | None
    model: str | None
    counts: UsageCounts


_RowKey = tuple[str, str, str]  # key id, tenant, model


@dataclass(slots=True)
class _Bucket:
    minute: int
    rows: dict[_RowKey, UsageCounts] = field(default_factory=dict)


class UsageLedger:
    """Per-minute usage over the last `horizon_s`. `clock` is `time.time` (tests pass
    their own); buckets are whole minutes of it."""

    def __init__(
        self,
        *,
        horizon_s: float = 86400.0,
        max_rows: int = 1000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.horizon_s = horizon_s
        self.max_rows = max_rows
        self._clock = clock
        self._buckets: deque[_Bucket] = deque(maxlen=max(1, int(horizon_s // BUCKET_S)))

    def add(
        self, key: str, tenant: str, model: str, num_prompt_tokens: int, num_completion_tokens: int
    ) -> None:
        """Count one finished request. Mutates the current minute's bucket."""
        minute = int(self._clock() // BUCKET_S)
        if not self._buckets or self._buckets[-1].minute != minute:
            self._buckets.append(_Bucket(minute))
        rows = self._buckets[-1].rows
        row_key = (key, tenant, model)
        if row_key not in rows and len(rows) >= self.max_rows:
            row_key = (OTHER, OTHER, OTHER)
        counts = rows.setdefault(row_key, UsageCounts())
        counts.add(UsageCounts(1, num_prompt_tokens, num_completion_tokens))

    def query(self, window_s: float, group_by: tuple[str, ...]) -> list[UsageRow]:
        """Rows of the last `window_s` (whole minutes, the current one included), grouped
        by the named fields of ("key", "tenant", "model"), most tokens first."""
        first = int(self._clock() // BUCKET_S) - max(1, int(window_s // BUCKET_S)) + 1
        groups: dict[tuple[str | None, ...], UsageCounts] = {}
        for bucket in self._buckets:
            if bucket.minute < first:
                continue
            for (key, tenant, model), counts in bucket.rows.items():
                named = {"key": key, "tenant": tenant, "model": model}
                group = tuple(named[name] if name in group_by else None for name in named)
                groups.setdefault(group, UsageCounts()).add(counts)
        rows = [UsageRow(g[0], g[1], g[2], counts) for g, counts in groups.items()]
        rows.sort(key=lambda r: -(r.counts.num_prompt_tokens + r.counts.num_completion_tokens))
        return rows

    def series(self, window_s: float) -> list[tuple[int, UsageCounts]]:
        """Totals per minute of the last `window_s`: (minute start, Unix seconds; counts)."""
        first = int(self._clock() // BUCKET_S) - max(1, int(window_s // BUCKET_S)) + 1
        out: list[tuple[int, UsageCounts]] = []
        for bucket in self._buckets:
            if bucket.minute >= first:
                total = UsageCounts()
                for counts in bucket.rows.values():
                    total.add(counts)
                out.append((bucket.minute * int(BUCKET_S), total))
        return out
