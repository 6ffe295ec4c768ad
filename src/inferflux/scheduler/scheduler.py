"""Continuous batching: which tokens of which requests go into the next engine step.

Owns: the waiting queue (FCFS), the running set, sequence-slot allocation and, in
unified-KV mode, the KV cell reservation. Pure logic: no llama.cpp, no I/O; tests call
`schedule()` directly and check the exact state after every step.

There are no prefill and decode phases. Each step has a token budget
(`max_batch_tokens`); every running request that has sampled a token feeds it (one
token each, first, so inter-token latency stays flat), then prompts still being
prefilled get chunks, then waiting requests are admitted while a sequence slot, budget
and KV cells remain. A request's computed-token count catches up with its length.
"""

from __future__ import annotations

import heapq
from collections import deque

from inferflux.scheduler.request import (
    Request,
    RequestId,
    RequestStatus,
    ScheduledChunk,
    SchedulerOutput,
    SeqId,
)


class Scheduler:
    """FCFS continuous-batching scheduler. Not thread-safe: one engine thread owns it."""

    def __init__(
        self, *, max_num_seqs: int, max_batch_tokens: int, kv_capacity: int | None
    ) -> None:
        """`kv_capacity`: cells shared by all sequences (unified KV), or None when each
        sequence slot has a full context of its own."""
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.kv_capacity = kv_capacity
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._requests: dict[RequestId, Request] = {}
        self._free_seq_ids: list[int] = list(range(max_num_seqs))
        self._reserved_cells = 0

    # -- queries -------------------------------------------------------------------
    def get(self, request_id: RequestId) -> Request | None:
        return self._requests.get(request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def can_ever_fit(self, request: Request) -> bool:
        """False when the request needs more KV cells than exist at all."""
        return self.kv_capacity is None or request.max_total_tokens <= self.kv_capacity

    # -- mutations -----------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request (FCFS). Raises ValueError on a duplicate id."""
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id}")
        request.status = RequestStatus.WAITING
        self._requests[request.request_id] = request
        self.waiting.append(request)

    def finish(self, request_id: RequestId) -> Request | None:
        """Remove a request wherever it is and free its slot. Returns it (its `seq_id`
        still set, so the caller can drop the KV), or None if unknown."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return None
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
            if request.seq_id is not None:
                heapq.heappush(self._free_seq_ids, request.seq_id)
            if self.kv_capacity is not None:
                self._reserved_cells -= request.max_total_tokens
        else:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        return request

    def schedule(self) -> SchedulerOutput:
        """Pick this step's chunks (see the module docstring). Admits waiting requests."""
        budget = self.max_batch_tokens
        chunks: list[ScheduledChunk] = []
        prefilling: list[Request] = []
        for request in self.running:
            if request.num_computed_tokens < request.num_prompt_tokens:
                prefilling.append(request)
            elif budget > 0:
                chunks.append(self._chunk(request, 1))
                budget -= 1
        for request in prefilling:
            if budget <= 0:
                break
            chunk = self._chunk(request, budget)
            chunks.append(chunk)
            budget -= len(chunk.token_ids)
        while budget > 0 and self.waiting and self._can_admit(self.waiting[0]):
            request = self._admit()
            chunk = self._chunk(request, budget)
            chunks.append(chunk)
            budget -= len(chunk.token_ids)
        return SchedulerOutput(chunks=chunks, num_tokens=self.max_batch_tokens - budget)

    def _can_admit(self, request: Request) -> bool:
        if not self._free_seq_ids:
            return False
        if self.kv_capacity is None:
            return True
        return self._reserved_cells + request.max_total_tokens <= self.kv_capacity

    def _admit(self) -> Request:
        request = self.waiting.popleft()
        # NOTE: the lowest free slot keeps active seq ids packed; scattered slots made
        # llama_decode up to 2x slower in per-sequence KV mode (ENGINE_NOTES.md).
        request.seq_id = SeqId(heapq.heappop(self._free_seq_ids))
        request.status = RequestStatus.RUNNING
        if self.kv_capacity is not None:
            self._reserved_cells += request.max_total_tokens
        self.running.append(request)
        return request

    @staticmethod
    def _chunk(request: Request, limit: int) -> ScheduledChunk:
        if request.seq_id is None:
            raise RuntimeError(f"{request.request_id} is scheduled without a sequence slot")
        token_ids = request.tokens_to_compute(limit)
        start = request.num_computed_tokens
        return ScheduledChunk(
            request=request,
            seq_id=request.seq_id,
            token_ids=token_ids,
            start_pos=start,
            sample=start + len(token_ids) == request.num_tokens,
        )
