"""`RequestTracker`: what `GET /debug/requests` shows: live generations and recent ones.

Owns: one `TrackedRequest` per generation submitted to the engine (its phase, token
counts, timings and a capped token trace), and a ring buffer of the last finished ones.
Memory is bounded: `history` finished requests, `max_events` trace events per request
(later events are counted in `num_dropped_events`, not stored). Does not own: the routes
(api/debug.py). One event loop; no locks.

Phases, in order: `queued` (sent to a worker) → `prefill` (the worker scheduled it) →
`decode` (first token out) → `finished`. Text is kept only with
`observability.debug_prompts`; token ids are always kept (admin-only endpoint), and an
image only as its SHA-256.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from inferflux.engine.messages import AddRequest, RequestDelta, RequestPhases


@dataclass(slots=True)
class TraceEvent:
    """One delta: when (seconds after submission), which tokens, and the text if allowed."""

    at_s: float
    token_ids: list[int]
    text: str | None


@dataclass(slots=True, eq=False)
class TrackedRequest:
    """One generation as the API process saw it (mutable until finished)."""

    request_id: str
    priority: str
    num_prompt_tokens: int
    max_tokens: int
    submitted_at: float  # time.monotonic()
    submitted_unix: float  # time.time(), for humans
    tenant: str | None = None  # of the caller (None: submitted outside a request)
    model: str | None = None  # the model id that serves it
    phase: str = "queued"
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    queue_wait_s: float | None = None
    first_token_s: float | None = None  # after submission
    # the worker's view, once it finished (RequestPhases): from its hand-off to the worker
    # (AddRequest.sent_at: the step in flight then counts), and from its first step, to
    # its first token; the rest of first_token_s is this process's own queueing
    # (tokenizing is before submission)
    engine_first_token_s: float | None = None
    engine_prefill_s: float | None = None
    finished_s: float | None = None  # after submission
    finish_reason: str | None = None
    error: str | None = None
    events: list[TraceEvent] = field(default_factory=list)
    num_dropped_events: int = 0
    image_sha256s: list[str] = field(default_factory=list)  # the prompt's images, never bytes

    def summary(self, now: float) -> dict[str, object]:
        """The JSON of one request in the list: everything but the token trace."""
        elapsed = self.finished_s if self.finished_s is not None else now - self.submitted_at
        return {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "model": self.model,
            "phase": self.phase,
            "priority": self.priority,
            "submitted_unix": round(self.submitted_unix, 3),
            "elapsed_s": round(elapsed, 6),
            "queue_wait_s": _round(self.queue_wait_s),
            "time_to_first_token_s": _round(self.first_token_s),
            "engine_time_to_first_token_s": _round(self.engine_first_token_s),
            "engine_prefill_s": _round(self.engine_prefill_s),
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_cached_tokens": self.num_cached_tokens,
            "num_output_tokens": self.num_output_tokens,
            "max_tokens": self.max_tokens,
            "finish_reason": self.finish_reason,
            "error": self.error,
        }

    def detail(self, now: float) -> dict[str, object]:
        """The summary plus the token trace (times in seconds after submission)."""
        return {
            **self.summary(now),
            "images": [{"sha256": sha256} for sha256 in self.image_sha256s],
            "num_dropped_events": self.num_dropped_events,
            "trace": [
                {"at_s": round(e.at_s, 6), "token_ids": e.token_ids, "text": e.text}
                for e in self.events
            ],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


class RequestTracker:
    """Live and recently finished generations. Every method mutates; one event loop."""

    def __init__(self, *, history: int, max_events: int, keep_text: bool) -> None:
        self._live: dict[str, TrackedRequest] = {}
        self._finished: OrderedDict[str, TrackedRequest] = OrderedDict()
        self._history = history
        self._max_events = max_events
        self._keep_text = keep_text

    def start(
        self, request: AddRequest, tenant: str | None = None, model: str | None = None
    ) -> TrackedRequest:
        """Track a request about to be submitted (replaces a live one with the same id)."""
        tracked = TrackedRequest(
            request_id=request.request_id,
            tenant=tenant,
            model=model,
            priority=str(request.priority),
            num_prompt_tokens=len(request.prompt_token_ids),
            max_tokens=request.sampling.max_tokens,
            submitted_at=time.monotonic(),
            submitted_unix=time.time(),
            image_sha256s=[image.sha256 for image in request.images],
        )
        self._live[request.request_id] = tracked
        return tracked

    def on_admitted(self, request_id: str, queue_wait_s: float) -> None:
        """A worker scheduled the request for the first time (unknown ids are ignored)."""
        tracked = self._live.get(request_id)
        if tracked is not None and tracked.phase == "queued":
            tracked.phase = "prefill"
            tracked.queue_wait_s = queue_wait_s

    def on_phases(self, phases: RequestPhases) -> None:
        """The worker's stamps of a finished request (live or in the history; unknown
        ids are ignored)."""
        tracked = self._live.get(phases.request_id) or self._finished.get(phases.request_id)
        if tracked is None or phases.first_token_at is None:
            return
        tracked.engine_first_token_s = phases.first_token_at - phases.added_at
        if phases.scheduled_at is not None:
            tracked.engine_prefill_s = phases.first_token_at - phases.scheduled_at

    def on_delta(self, tracked: TrackedRequest, delta: RequestDelta, now: float) -> None:
        """Record one delta: tokens so far, the trace event, the phase."""
        at_s = now - tracked.submitted_at
        tracked.num_output_tokens = delta.num_output_tokens
        tracked.num_cached_tokens = delta.num_cached_tokens
        if delta.token_ids:
            if tracked.first_token_s is None:
                tracked.first_token_s = at_s
            tracked.phase = "decode"
            if len(tracked.events) < self._max_events:
                text = delta.text if self._keep_text else None
                tracked.events.append(TraceEvent(at_s, list(delta.token_ids), text))
            else:
                tracked.num_dropped_events += 1
        if delta.finish_reason is not None:
            tracked.finish_reason = str(delta.finish_reason)
            tracked.error = delta.error

    def finish(self, tracked: TrackedRequest, now: float, error: str | None = None) -> None:
        """The request is over (finished, failed or abandoned): move it to the history."""
        if self._live.get(tracked.request_id) is tracked:
            del self._live[tracked.request_id]
        tracked.phase = "finished"
        tracked.finished_s = now - tracked.submitted_at
        if tracked.finish_reason is None:
            tracked.finish_reason = "abort" if error is None else "error"
            tracked.error = error
        if self._history == 0:
            return
        self._finished.pop(tracked.request_id, None)
        self._finished[tracked.request_id] = tracked
        while len(self._finished) > self._history:
            self._finished.popitem(last=False)

    def live(self) -> list[TrackedRequest]:
        """Running and queued requests, oldest first."""
        return sorted(self._live.values(), key=lambda t: t.submitted_at)

    def recent(self) -> list[TrackedRequest]:
        """Finished requests still in the ring buffer, newest first."""
        return list(reversed(self._finished.values()))

    def get(self, request_id: str) -> TrackedRequest | None:
        return self._live.get(request_id) or self._finished.get(request_id)
