"""`StepRecorder`: the engine's timing stats, collected between two worker messages.

Owns: per-request phase stamps (arrival, first scheduled, first token, finish) and the
`StepStats` the worker sends with its next `StepOutputs`. Does not own: metrics (the API
process maps `StepStats` to Prometheus histograms) or spans (observability/tracing.py).

Cost: one `time.monotonic()` per step and per finish, one dict lookup per scheduled chunk;
no per-token objects. Thread rule: the engine thread only (like `EngineCore`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from inferflux.engine.messages import Admission, RequestPhases, StepStats
from inferflux.scheduler import Request, RequestId, ScheduledChunk


@dataclass(slots=True)
class _Stamps:
    scheduled_at: float
    first_token_at: float | None = None


def _priority(request: Request) -> str:
    return request.priority.name.lower()


class StepRecorder:
    """Accumulates `StepStats` until `take()`. Every method mutates."""

    def __init__(self) -> None:
        self._stamps: dict[RequestId, _Stamps] = {}
        self._pending = StepStats()
        self._has_pending = False

    def on_scheduled(self, chunks: Sequence[ScheduledChunk], started_at: float) -> None:
        """Before the decode: requests scheduled for the first time are admitted now."""
        for chunk in chunks:
            request = chunk.request
            if request.request_id not in self._stamps:
                self._stamps[request.request_id] = _Stamps(scheduled_at=started_at)
                wait_s = max(0.0, started_at - request.arrival_at)
                self._pending.admitted.append(
                    Admission(request.request_id, _priority(request), wait_s)
                )
                self._has_pending = True

    def on_step_done(
        self, chunks: Sequence[ScheduledChunk], num_tokens: int, started_at: float
    ) -> None:
        """After the step's tokens were sampled: its duration, size, and first tokens."""
        now = time.monotonic()
        pending = self._pending
        pending.step_exec_s.append(now - started_at)
        pending.step_num_seqs.append(len(chunks))
        pending.step_num_tokens.append(num_tokens)
        self._has_pending = True
        for chunk in chunks:
            if chunk.sample:
                stamps = self._stamps.get(chunk.request.request_id)
                if stamps is not None and stamps.first_token_at is None:
                    stamps.first_token_at = now

    def on_finished(self, request: Request, finish_reason: str) -> None:
        """A request left the engine (any reason): its phases go out with the next message."""
        now = time.monotonic()
        stamps = self._stamps.pop(request.request_id, None)
        first_token_at = stamps.first_token_at if stamps is not None else None
        if first_token_at is None and stamps is not None and request.output_token_ids:
            first_token_at = now  # it finished at its first token
        self._pending.finished.append(
            RequestPhases(
                request_id=request.request_id,
                priority=_priority(request),
                added_at=request.arrival_at,
                scheduled_at=stamps.scheduled_at if stamps is not None else None,
                first_token_at=first_token_at,
                finished_at=now,
                num_prompt_tokens=request.num_prompt_tokens,
                num_cached_tokens=request.num_cached_tokens,
                num_output_tokens=len(request.output_token_ids),
                finish_reason=finish_reason,
            )
        )
        self._has_pending = True

    def take(self, num_prompt_tokens: int, num_generated_tokens: int) -> StepStats | None:
        """The stats since the previous call (None if nothing happened), with these token
        counts; starts a fresh accumulation."""
        if not self._has_pending and not (num_prompt_tokens or num_generated_tokens):
            return None
        stats = self._pending
        stats.num_prompt_tokens = num_prompt_tokens
        stats.num_generated_tokens = num_generated_tokens
        self._pending = StepStats()
        self._has_pending = False
        return stats
