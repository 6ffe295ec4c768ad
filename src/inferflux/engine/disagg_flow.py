"""`DisaggregatedFlow`: one request's way through the prefill pool, the KV channel and
the decode pool (`scheduler.mode: disaggregated`). DESIGN.md §6, docs/scheduling.md.

Owns: whether a request is handed off or runs on a decode worker directly, reserving
its ticket in the channel (engine/ticket_slots.py) before its prefill starts, the
prefill leg (a prefill worker computes the prompt but its last token and writes the KV
ticket: `FinishReason.HANDOFF`), and giving the ticket to the decode leg. Does not own:
streaming from a worker, resubmitting after a worker dies, aborts (engine/client.py,
whose `serve` it calls), nor writing or reading tickets (the workers:
engine/kv_channel.py).

Why the prefill stops one token early: the decode worker then computes the last prompt
token itself and samples the first output token from its own logits, so nothing but KV
crosses (no logits, no sampler state: the decode worker builds the request's sampler as
in unified mode, seed and grammar included), and it works unchanged for models whose
state cannot be rolled back (recurrent and hybrid layers, whose state after n tokens
cannot be trimmed to n-1). The cost is one decode row per request.

What runs direct (on a decode worker, computing its prompt as in unified mode): prompts
shorter than `min_prompt_tokens`, requests with images (their rows are encoded where the
mmproj runs; a hand-off would need them on both sides), requests asking for prompt
logprobs (every prompt position's logits, on the worker that streams them), any request
while no prefill worker is ready, a blocked one (the channel stayed full past
`ticket_wait_s`), one whose prefill worker died or failed, and one whose ticket could not
be written. Every one of them completes or ends with the same clean error as in unified
mode: no ticket is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable

import msgspec

from inferflux.config.settings import Settings
from inferflux.engine.messages import (
    AddRequest,
    FinishReason,
    KvTicket,
    RequestDelta,
    SamplingParams,
)
from inferflux.engine.ticket_slots import TicketSlots
from inferflux.engine.worker_pool import PoolWorker, WorkerPool
from inferflux.errors import EngineDeadError, NoWorkerReady

logger = logging.getLogger(__name__)

# serve(request, ticket): the client's resubmitting stream from a decode worker
Serve = Callable[[AddRequest, KvTicket | None], AsyncGenerator[RequestDelta, None]]
# stream(worker, request): one worker's deltas of one request (the client's _generate_on)
Stream = Callable[[PoolWorker, AddRequest], AsyncGenerator[RequestDelta, None]]
# pick(request): the prefill worker for a request (raises NoWorkerReady)
Pick = Callable[[AddRequest], PoolWorker]

_PREFILL_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)  # it samples nothing


class _AbortedWaiting(Exception):
    """`abort` ended a request while it waited for room in the channel."""


class DisaggregatedFlow:
    """The request flow of disaggregated mode (see the module docstring)."""

    def __init__(
        self,
        pool: WorkerPool,
        settings: Callable[[], Settings],
        *,
        stream: Stream,
        pick_prefill: Pick,
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._stream = stream
        self._pick_prefill = pick_prefill
        self.slots = TicketSlots(lambda: settings().scheduler.disaggregated)
        # requests waiting for room in the channel: `abort` sets their event
        self._waiting: dict[str, asyncio.Event] = {}

    async def generate(
        self, request: AddRequest, serve: Serve, check: Callable[[], None] | None = None
    ) -> AsyncGenerator[RequestDelta, None]:
        """`request`'s deltas: prefilled by the prefill pool when it qualifies, then
        streamed by a decode worker (`serve`, which resubmits if that worker dies).
        `check` runs first (the client's backpressure: it raises QueueFull)."""
        if check is not None:
            check()
        try:
            path = await self._reserve(request)
        except _AbortedWaiting:
            yield RequestDelta(
                request_id=request.request_id,
                finish_reason=FinishReason.ABORT,
                num_prompt_tokens=len(request.prompt_token_ids),
            )
            return
        try:
            ticket: KvTicket | None = None
            if path is not None:
                outcome = await self._prefill(request, path)
                if isinstance(outcome, RequestDelta):  # aborted while prefilling
                    yield outcome
                    return
                ticket = outcome
            counters = self.slots.counters
            if ticket is None:
                counters.direct += 1
            else:
                counters.handed_off += 1
            first = True
            async for delta in serve(request, ticket):
                if first and path is not None:
                    # hydrated (or refused) before this delta's step: room for more, and
                    # with a ticket written, a file to recycle
                    self.slots.release(path, recycle=ticket is not None)
                first = False
                yield delta
        finally:
            if path is not None:
                self.slots.release(path)

    def _qualifies(self, request: AddRequest) -> bool:
        settings = self._settings().scheduler.disaggregated
        return (
            len(request.prompt_token_ids) >= settings.min_prompt_tokens
            and not request.images
            and request.sampling.prompt_logprobs is None
            and any(w.ready and w.role == "prefill" for w in self._pool.workers.values())
        )

    def abort(self, request_id: str) -> None:
        """`EngineClient.abort` of a request waiting for room in the channel (no worker
        holds it yet): it ends with an ABORT delta at once."""
        event = self._waiting.get(request_id)
        if event is not None:
            event.set()

    async def _reserve(self, request: AddRequest) -> str | None:
        """The request's ticket path, or None when it runs direct (see the module doc).
        Raises _AbortedWaiting when `abort` ends it while it waits for room."""
        if not self._qualifies(request):
            return None
        aborted = self._waiting[request.request_id] = asyncio.Event()
        reserve = asyncio.ensure_future(self.slots.reserve(len(request.prompt_token_ids) - 1))
        stop = asyncio.ensure_future(aborted.wait())
        waited = False
        try:
            await asyncio.wait({reserve, stop}, return_when=asyncio.FIRST_COMPLETED)
            waited = True
        finally:
            stop.cancel()
            del self._waiting[request.request_id]
            reserve.cancel()  # no-op once done
            path = reserve.result() if reserve.done() and not reserve.cancelled() else None
            if path is not None and (aborted.is_set() or not waited):
                self.slots.release(path)  # aborted, or this task cancelled meanwhile
        if aborted.is_set():
            raise _AbortedWaiting
        return path

    async def _prefill(self, request: AddRequest, path: str) -> KvTicket | RequestDelta | None:
        """Run the prefill leg: the ticket, the ABORT delta that ended the request, or
        None when the request is to run direct instead (logged why)."""
        sent = msgspec.structs.replace(
            request, sampling=_PREFILL_SAMPLING, ticket_path=path, kv_ticket=None
        )
        slots = self.slots
        slots.prefill_queue += 1
        try:
            worker = self._pick_prefill(sent)
            async with contextlib.aclosing(self._stream(worker, sent)) as deltas:
                async for delta in deltas:
                    reason = delta.finish_reason
                    if reason is FinishReason.HANDOFF:
                        if delta.ticket is not None:
                            slots.written(path, delta.ticket)
                        return delta.ticket
                    if reason is FinishReason.ABORT:
                        return delta
                    if reason is not None:
                        logger.warning(
                            "prefill of %s ended %s (%s): its decode worker computes it",
                            request.request_id,
                            reason,
                            delta.error,
                        )
                        return None
        except NoWorkerReady:
            return None
        except EngineDeadError as exc:
            slots.counters.resubmitted += 1
            logger.warning("prefill of %s lost (%s): computing it on a decode worker",
                           request.request_id, exc)  # fmt: skip
            return None
        finally:
            slots.prefill_queue -= 1
        return None
