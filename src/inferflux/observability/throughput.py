"""`ThroughputMeter`: prompt and generation tokens per second over recent windows.

Owns: one-second buckets in a ring (the last `horizon_s` seconds), fed with the token
counts of every engine step. Serves `GET /server/stats` (last 10 s and 1 min); Prometheus
users take `rate()` of the token counters instead. Not thread-safe: one event loop.
"""

from __future__ import annotations

import math
import time


class ThroughputMeter:
    """Token counts per one-second bucket, for the last `horizon_s` seconds."""

    def __init__(self, horizon_s: int = 60) -> None:
        self._horizon_s = horizon_s
        self._seconds = [-1] * (horizon_s + 1)  # which second each bucket holds now
        self._prompt = [0] * (horizon_s + 1)
        self._generated = [0] * (horizon_s + 1)

    def add(self, num_prompt: int, num_generated: int, now: float | None = None) -> None:
        """Count tokens at `now` (default: time.monotonic())."""
        second = math.floor(time.monotonic() if now is None else now)
        index = second % len(self._seconds)
        if self._seconds[index] != second:
            self._seconds[index] = second
            self._prompt[index] = 0
            self._generated[index] = 0
        self._prompt[index] += num_prompt
        self._generated[index] += num_generated

    def rates(self, window_s: int, now: float | None = None) -> tuple[float, float]:
        """(prompt, generated) tokens per second over the last `window_s` whole seconds
        before `now` plus the current one. `window_s` is clamped to the horizon."""
        window_s = max(1, min(window_s, self._horizon_s))
        current = math.floor(time.monotonic() if now is None else now)
        oldest = current - window_s
        prompt = generated = 0
        for second, p, g in zip(self._seconds, self._prompt, self._generated, strict=True):
            if oldest < second <= current:
                prompt += p
                generated += g
        return prompt / window_s, generated / window_s
