"""Continuous batching: request state, the per-step `SchedulerOutput`, and `Scheduler`."""

from inferflux.scheduler.request import (
    Request,
    RequestId,
    RequestStatus,
    ScheduledChunk,
    SchedulerOutput,
    SeqId,
)
from inferflux.scheduler.scheduler import Scheduler

__all__ = [
    "Request",
    "RequestId",
    "RequestStatus",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerOutput",
    "SeqId",
]
