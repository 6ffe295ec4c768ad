"""Stopping an engine step part-way for a high-priority arrival, and a request's arrival.

A worker reads new requests between steps (engine/worker.py), so one that arrives during
a step waits for the rest of it: on 2 CPU cores a step with 16 decode rows and a
128-token prompt chunk takes most of a second, 16 decode rows alone 0.2 s. With
`scheduler.fairness.interrupt_steps` EngineCore arms such a step
(`ModelBackend.set_interrupt`): llama.cpp's CPU backend calls the check between graph
operations, the worker loop reads its socket from it, and a new
high-priority request stops the step (`StepInterrupted`); the sequences are trimmed to
where it began and the next step is planned with that request (docs/scheduling.md).

Pure logic over the scheduler's state; EngineCore owns the calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inferflux.engine.backends.base import ModelBackend
from inferflux.scheduler import ScheduledChunk, Scheduler
from inferflux.scheduler.request import PriorityClass

# AddRequest.sent_at: a larger gap than this is a clock step, not a wait
MAX_INBOX_WAIT_S = 60.0
# a step is stopped only in this first share of its expected time (at 0.5, half the
# arrivals came too late and waited out 0.25-0.5 s of a 1 s step: priority bench)
STOP_BEFORE = 0.9


def arrival_at(sent_at: float) -> float:
    """A request's `time.monotonic()` arrival: when the API process sent it (a
    `time.time()` stamp, 0 = unknown), not when the worker read it after the step in
    flight, so that wait is queue wait too."""
    now = time.monotonic()
    if sent_at <= 0.0:
        return now
    return now - min(max(0.0, time.time() - sent_at), MAX_INBOX_WAIT_S)


def can_stop(chunks: list[ScheduledChunk], scheduler: Scheduler) -> bool:
    """Whether a HIGH-priority arrival may stop this step: it carries no draft (a draft
    model's proposer has advanced its own context) and nothing of a HIGH-class request,
    it does not follow a step the streams stood aside for (`Scheduler.after_aside`: they
    decode at least every other step), and it carries prompt tokens (the long steps, up
    to `max_batch_tokens` of them) or HIGH-class requests arrived lately
    (`Scheduler.high_traffic`). A decode-only step is stopped only then: 16 rows take
    0.2 s on 2 cores, the wait of a third of the slowest arrivals (priority bench). The
    condition is a precaution, not a measured need: arming every step of an in-process
    engine cost nothing measurable at c = 1 or 8 (BENCHMARKS.md, tenth session)."""
    if not scheduler.policy.interrupt_steps or scheduler.after_aside:
        return False
    prompt = False
    for chunk in chunks:
        if chunk.request.priority == PriorityClass.HIGH or chunk.draft_token_ids:
            return False
        prompt = prompt or len(chunk.token_ids) > 1
    return prompt or scheduler.high_traffic


def stop_check(
    chunks: list[ScheduledChunk],
    num_tokens: int,
    scheduler: Scheduler,
    high_arrived: Callable[[], bool],
) -> Callable[[], bool]:
    """The check to arm the step with: True when a HIGH-priority request arrived
    (`high_arrived`, the worker loop's socket read) while the step is in the first
    `STOP_BEFORE` of its expected time; later, the rest of the step costs that request
    less than stopping costs the step's other requests."""
    decoding = sum(1 for c in chunks if len(c.token_ids) == 1)
    expected_s = scheduler.step_cost.predict_s(decoding, num_tokens - decoding)
    until = time.monotonic() + STOP_BEFORE * expected_s

    def check() -> bool:
        return high_arrived() and time.monotonic() < until

    return check


def arm(
    backend: ModelBackend,
    chunks: list[ScheduledChunk],
    num_tokens: int,
    scheduler: Scheduler,
    high_arrived: Callable[[], bool] | None,
) -> bool:
    """Arm `backend` with this step's `stop_check` where `can_stop` (the worker loop set
    `high_arrived`); whether it did (the caller disarms after the step)."""
    if high_arrived is None or not can_stop(chunks, scheduler):
        return False
    backend.set_interrupt(stop_check(chunks, num_tokens, scheduler, high_arrived))
    return True
