"""`WorkerPoolClient`: the API process's `EngineClient` over worker processes (or threads).

Owns: the request side of one model's workers: sending each generation request to the
ready worker its router picks (`scheduler.routing`, engine/routing.py), resubmitting one
whose worker died before it produced anything, backpressure (`scheduler.high_watermark`),
the receive loop's dispatch of every worker message (each `StepOutputs` delta to its
request's asyncio.Queue), aborts, live reconfiguration, and failing a worker's in-flight
requests with EngineDeadError when it dies, hangs or is removed.

Does not own, and delegates to collaborators that get what they need passed in:
- the workers, their sockets, processes and IPC channels: `WorkerPool`
  (engine/worker_pool.py; ids are never reused in one server's life);
- noticing a dead or hung worker and replacing it, health pings: `PoolWatchdog`
  (engine/pool_watchdog.py, with the hang rule in engine/worker_health.py);
- runtime scaling (`scale`: workers added, or drained and removed): `PoolScaler`
  (engine/pool_scaling.py);
- embeddings (`embed`): `EmbedDispatch` (engine/embed_dispatch.py);
- engine logic (engine/core.py, in the workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import msgspec
import zmq

from inferflux.config.settings import ObservabilitySettings, SchedulerSettings, Settings
from inferflux.engine.disagg_flow import DisaggregatedFlow
from inferflux.engine.embed_dispatch import EmbedDispatch
from inferflux.engine.engine_build import WorkerConfig, worker_config
from inferflux.engine.messages import (
    AddRequest,
    EmbedResult,
    FinishReason,
    KvTicket,
    Pong,
    Reconfigure,
    RequestDelta,
    StepOutputs,
    StepStats,
    WorkerFailed,
    WorkerReady,
    decode_output,
    encode,
)
from inferflux.engine.pool_scaling import PoolScaler
from inferflux.engine.pool_watchdog import PoolWatchdog
from inferflux.engine.protocol import (
    ChannelStats,
    EmbeddingResult,
    EngineClient,
    ModelInfo,
    WorkerStatus,
)
from inferflux.engine.routing import RouteRequest, WorkerLoad, make_worker_router
from inferflux.engine.worker_pool import MAX_RESUBMITS, RESUBMIT_WAIT_S, PoolWorker, WorkerPool
from inferflux.errors import (
    EngineDeadError,
    InvalidRequest,
    ModelLoadError,
    QueueFull,
    QueueTimeout,
)

logger = logging.getLogger(__name__)

_SWEEP_EVERY_S = 5.0  # orphaned KV ticket files (disaggregated mode): engine/ticket_slots.py
# Finishes after which a worker caches the request's prompt and output (engine/core.py).
_CACHED_FINISHES = frozenset({FinishReason.STOP, FinishReason.STOP_SEQUENCE, FinishReason.LENGTH})


class _Aborted(Exception):
    """Queued by `abort`: the stream ends now, before the worker's own ABORT delta."""


def _abort_delta(last: RequestDelta) -> RequestDelta:
    """The ABORT delta of a request `abort` ended, with the counts of its last delta
    (cumulative, so usage, metrics and the audit record stay right)."""
    return RequestDelta(
        request_id=last.request_id,
        finish_reason=FinishReason.ABORT,
        num_prompt_tokens=last.num_prompt_tokens,
        num_output_tokens=last.num_output_tokens,
        num_cached_tokens=last.num_cached_tokens,
    )


def _load(worker: PoolWorker) -> WorkerLoad:
    """What routing sees of `worker`."""
    stats = worker.stats
    cache = stats.prefix_cache
    return WorkerLoad(
        worker_id=worker.worker_id,
        generation=worker.generation,
        ready=worker.ready,
        num_in_flight=len(worker.in_flight),
        kv_cells_used=stats.kv_cells_used,
        kv_cells_total=stats.kv_cells_total,
        cache_max_tokens=cache.max_tokens if cache is not None else 0,
    )


def _cached_tokens(request: AddRequest, last: RequestDelta, output: list[int]) -> list[int] | None:
    """The tokens a finished request left in its worker's prefix cache: its prompt and
    every output token but the last (sampled, never decoded); None unless it finished
    normally (an aborted or failed one may have computed less)."""
    if last.finish_reason is FinishReason.HANDOFF:
        return request.prompt_token_ids[:-1]  # a prefill worker computed all but the last
    if last.finish_reason not in _CACHED_FINISHES:
        return None
    return request.prompt_token_ids + output[:-1]


class WorkerPoolClient:
    """EngineClient over `settings.runtime.workers` engine workers."""

    def __init__(self, settings: Settings, model_info: ModelInfo) -> None:
        self.settings = settings
        self.model_info = model_info
        self._queues: dict[str, tuple[asyncio.Queue[RequestDelta | Exception], PoolWorker]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._backpressure = False
        self._step_observers: list[Callable[[int, StepStats], None]] = []
        self._n_batch = settings.scheduler.max_batch_tokens  # the contexts' batch, for good
        self._reconfigured = False  # a live change happened: workers get it once ready
        self._router = make_worker_router()  # reads settings.scheduler.routing per request
        self._prefill_router = make_worker_router()  # the prefill pool's (disaggregated)
        self._init_collaborators(settings)

    def _init_collaborators(self, settings: Settings) -> None:
        runtime, scheduler = settings.runtime, settings.scheduler
        disaggregated = scheduler.mode == "disaggregated"
        roles = (
            ["prefill"] * scheduler.prefill_pool_size + ["decode"] * scheduler.decode_pool_size
            if disaggregated
            else ["unified"] * runtime.workers
        )
        self._pool = WorkerPool(roles, in_process=runtime.in_process, config=self._worker_config)
        self._flow = (
            DisaggregatedFlow(
                self._pool,
                lambda: self.settings,
                stream=self._generate_on,
                pick_prefill=lambda r: self._pick_worker(r, prefill=True),
            )
            if disaggregated
            else None
        )
        if runtime.kv_persistence.enabled:  # the worker writes its KV snapshot on stop
            self._pool.shutdown_join_s += runtime.kv_persistence.shutdown_budget_s
        self._watchdog = PoolWatchdog(
            self._pool, runtime, fail_in_flight=self._fail_in_flight, on_ready=self._on_ready
        )
        self._scaler = PoolScaler(self._pool, runtime, fail_in_flight=self._fail_in_flight)
        self._embeds = EmbedDispatch(self._pool, self._pick_worker)

    # -- EngineClient -----------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._pool.ready

    async def start(self) -> None:
        if self._flow is not None:
            self._flow.slots.open()
        await self._pool.open(self._on_output)
        self._tasks = [asyncio.create_task(self._watchdog.run(), name="engine-watchdog")]
        if self._flow is not None:
            self._tasks.append(asyncio.create_task(self._sweep_tickets(), name="kv-sweep"))
        await self._wait_first_ready()

    async def _sweep_tickets(self) -> None:
        """Delete orphaned ticket files now and then (kill -9 between write and delete)."""
        assert self._flow is not None
        while True:
            await asyncio.sleep(_SWEEP_EVERY_S)
            if removed := self._flow.slots.sweep():
                logger.warning("removed %d orphaned KV ticket files", removed)

    async def _wait_first_ready(self) -> None:
        deadline = time.monotonic() + self.settings.runtime.worker_start_timeout_s
        workers = self._pool.workers
        while not self.ready:
            failures = [w.failed for w in workers.values() if w.failed]
            if len(failures) == len(workers):
                raise ModelLoadError(f"no worker could load the model: {failures[0]}")
            if time.monotonic() > deadline:
                raise ModelLoadError("no worker became ready within runtime.worker_start_timeout_s")
            await asyncio.sleep(0.02)

    async def shutdown(self) -> None:
        self._pool.closing = True
        self._scaler.cancel()
        workers = list(self._pool.workers.values())
        for worker in workers:
            worker.ready = False  # late requests get NoWorkerReady (503), not a dead socket
        await self._pool.stop(workers)
        for task in self._tasks:
            task.cancel()
        for worker in self._pool.workers.values():
            self._fail_in_flight(worker, EngineDeadError("the server is shutting down"))
        self._pool.close()
        if self._flow is not None:
            self._flow.slots.close()

    def generate(self, request: AddRequest) -> AsyncIterator[RequestDelta]:
        # NOTE: the stream itself, not a generator around it: one layer less per delta on
        # the SSE path. Backpressure (QueueFull) is raised at the first iteration.
        if self._flow is None:
            return self._serve(request, check=True)
        return self._flow.generate(request, self._serve, check=self._check_backpressure)

    async def _serve(
        self, request: AddRequest, ticket: KvTicket | None = None, *, check: bool = False
    ) -> AsyncGenerator[RequestDelta, None]:
        """Stream `request` from a worker clients stream from (hydrating `ticket` there
        first, in disaggregated mode).

        NOTE: a worker can die before the watchdog notices; a request it had not produced
        anything for yet is resubmitted to another ready worker (spec REQ 9.4), without its
        ticket (that worker may have consumed it: the prompt is computed). One that
        already streamed output fails: its sampling state died with the worker. `check`:
        apply backpressure first (a request's first stream)."""
        if check:
            self._check_backpressure()
        for attempt in range(MAX_RESUBMITS + 1):
            sent = request
            if ticket is not None and attempt == 0:
                sent = msgspec.structs.replace(request, kv_ticket=ticket)
            worker = self._pick_worker(sent)
            produced = False
            try:
                async for delta in self._generate_on(worker, sent):
                    if delta.finish_reason is FinishReason.TIMEOUT:
                        raise QueueTimeout(
                            "the request waited in the queue longer than "
                            f"{self.settings.scheduler.queue_timeout_s:g} s "
                            "(scheduler.queue_timeout_s); retry later"
                        )
                    produced = True
                    yield delta
                return
            except EngineDeadError:
                if produced or attempt == MAX_RESUBMITS or self._pool.closing:
                    raise
                logger.warning("resubmitting %s after its worker died", request.request_id)
                await self._pool.wait_ready(RESUBMIT_WAIT_S)

    def queue_depth(self) -> int:
        """Requests submitted and not running yet (queued in a worker, or on the way)."""
        workers = self._pool.workers.values()
        return max(
            0, sum(len(w.in_flight) for w in workers) - sum(w.stats.num_running for w in workers)
        )

    def _check_backpressure(self) -> None:
        """Raise QueueFull while the queue is above the high watermark, until it drains
        to the low watermark (hysteresis; no worker is touched)."""
        depth = self.queue_depth()
        scheduler = self.settings.scheduler
        if self._backpressure and depth <= scheduler.low_watermark:
            self._backpressure = False
            logger.info("backpressure off: queue depth %d", depth)
        elif not self._backpressure and depth >= scheduler.high_watermark:
            self._backpressure = True
            logger.warning("backpressure on: queue depth %d", depth)
        if self._backpressure:
            raise QueueFull(
                f"the server is overloaded ({depth} requests queued, "
                f"scheduler.high_watermark {scheduler.high_watermark}); retry later"
            )

    async def _generate_on(
        self, worker: PoolWorker, request: AddRequest
    ) -> AsyncGenerator[RequestDelta, None]:
        queue: asyncio.Queue[RequestDelta | Exception] = asyncio.Queue()
        request_id = request.request_id
        self._queues[request_id] = (queue, worker)
        worker.in_flight.add(request_id)
        finished = False
        last = RequestDelta(request_id=request_id)
        output: list[int] = []  # what the worker's prefix cache keeps: prompt + output
        try:
            await self._pool.send(
                worker, encode(msgspec.structs.replace(request, sent_at=time.time()))
            )
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    finished = True
                    if isinstance(item, _Aborted):  # `abort`: end with the counts so far
                        yield _abort_delta(last)
                        return
                    raise item
                finished = item.finish_reason is not None
                last = item
                output.extend(item.token_ids)
                yield item
                if finished:
                    return
        finally:
            self._forget(request_id)
            router = self._prefill_router if worker.role == "prefill" else self._router
            router.finish(request_id, _cached_tokens(request, last, output))
            if not finished:
                await self._pool.send_abort(worker, request_id)

    async def abort(self, request_id: str) -> None:
        """Abort the request in its worker and end its stream now with an ABORT delta:
        the worker's own comes only after its current step (and is then dropped)."""
        if self._flow is not None:
            self._flow.abort(request_id)  # waiting for the KV channel: no worker has it
        entry = self._queues.get(request_id)
        if entry is not None:
            await self._pool.send_abort(entry[1], request_id)
            entry[0].put_nowait(_Aborted())

    def workers(self) -> list[WorkerStatus]:
        return [
            WorkerStatus(
                worker_id=w.worker_id,
                pid=w.pid,
                ready=w.ready,
                restarts=w.restarts,
                num_in_flight=len(w.in_flight),
                stats=w.stats,
                load_s=w.load_s,
                routing=self._router.stats(w.worker_id),
                hangs=w.health.hangs,
                draining=w.draining,
                backend=w.backend,
                requested_backend=w.requested_backend,
                fallback_reason=w.fallback_reason,
                role=w.role,
            )
            for w in self._pool.workers.values()
        ]

    def observe_steps(self, observer: Callable[[int, StepStats], None]) -> None:
        self._step_observers.append(observer)

    def channel(self) -> ChannelStats | None:
        return self._flow.slots.stats() if self._flow is not None else None

    async def reconfigure(
        self, scheduler: SchedulerSettings, observability: ObservabilitySettings
    ) -> None:
        """Live tuning: every ready worker gets the new knobs now, the others once they
        report ready (a restarted one too). Each worker keeps the step budget within its
        context's batch (`_WorkerLoop._reconfigure`)."""
        self.settings = self.settings.model_copy(
            update={"scheduler": scheduler, "observability": observability}
        )
        self._reconfigured = True
        for worker in self._pool.workers.values():
            if worker.ready:
                self._push_settings(worker)

    def _push_settings(self, worker: PoolWorker) -> None:
        message = Reconfigure(
            scheduler=self.settings.scheduler.model_dump(mode="json"),
            observability=self.settings.observability.model_dump(mode="json"),
        )
        if worker.socket is not None:
            with contextlib.suppress(zmq.ZMQError):  # gone: it restarts and gets them then
                worker.socket.send(encode(message), zmq.NOBLOCK)

    # -- routing and dispatch -------------------------------------------------------------
    def _pick_worker(
        self, request: AddRequest | None = None, *, prefill: bool = False
    ) -> PoolWorker:
        """The worker for `request` by `scheduler.routing` (engine/routing.py), read now so
        a live change applies at once; the least-loaded one for an embedding (None). Only
        workers clients stream from, or only prefill workers (`prefill`), each pool with
        a router of its own."""
        router = self._prefill_router if prefill else self._router
        loads = [_load(w) for w in self._pool.workers.values() if w.serves != prefill]
        if request is None:
            worker_id = router.route_any(loads)
        else:
            route = RouteRequest(
                request.request_id,
                request.prompt_token_ids,
                request.sampling.max_tokens,
                request.cache_namespace,
            )
            worker_id = router.route(route, loads, self.settings.scheduler).worker_id
        return self._pool.workers[worker_id]

    def _forget(self, request_id: str) -> None:
        entry = self._queues.pop(request_id, None)
        if entry is not None:
            entry[1].in_flight.discard(request_id)

    def _on_output(self, data: bytes) -> None:
        """One message from a worker's output channel (called by the event loop)."""
        message = decode_output(data)
        worker = self._pool.workers.get(message.worker_id)
        if worker is None or message.generation != worker.generation:
            return  # from a worker that has been replaced or removed
        worker.health.heard(time.monotonic())
        if isinstance(message, StepOutputs):
            worker.stats = message.stats
            if message.step is not None:
                self._observe_step(worker.worker_id, message.step)
            self._dispatch(message.deltas)
        elif isinstance(message, Pong):
            self._watchdog.answered(worker, message.seq, message.busy_s)
        elif isinstance(message, WorkerReady):
            worker.loaded, worker.pid, worker.failed = True, message.pid, None
            worker.load_s = message.load_s
            worker.backend, worker.requested_backend = message.backend, message.requested_backend
            worker.fallback_reason = message.fallback_reason
            self._watchdog.ping(worker)  # ready once it answers: a health check before rotation
        elif isinstance(message, WorkerFailed):
            worker.failed = message.message
        elif isinstance(message, EmbedResult):
            self._embeds.resolve(message)

    def _observe_step(self, worker_id: int, step: StepStats) -> None:
        """Hand a step's stats to the observers (before its deltas, so an admission is
        known before the first token). An observer's bug never stops the receive loop."""
        for observer in self._step_observers:
            try:
                observer(worker_id, step)
            except Exception:  # NOTE: metrics must not take generation down
                logger.exception("a step-stats observer failed")

    def _dispatch(self, deltas: list[RequestDelta]) -> None:
        for delta in deltas:
            entry = self._queues.get(delta.request_id)
            if entry is not None:
                entry[0].put_nowait(delta)

    def _fail_in_flight(self, worker: PoolWorker, error: Exception) -> None:
        for request_id in list(worker.in_flight):
            entry = self._queues.get(request_id)
            if entry is not None:
                entry[0].put_nowait(error)
        self._embeds.fail(worker, error)
        worker.in_flight.clear()

    # -- collaborators' hooks --------------------------------------------------------------
    async def embed(self, inputs: list[list[int]], *, normalize: bool = True) -> EmbeddingResult:
        return await self._embeds.embed(inputs, normalize=normalize)

    async def scale(self, num_workers: int, role: str | None = None) -> list[WorkerStatus]:
        """Run `num_workers` workers (of `role`'s pool) from now on (engine/protocol.py
        has the contract; engine/pool_scaling.py does it)."""
        await self._scaler.scale(num_workers, self._scaled_role(role))
        return self.workers()

    def _scaled_role(self, role: str | None) -> str:
        """The pool `scale` changes: None is the one clients stream from."""
        if self._flow is None:
            if role not in (None, "unified"):
                raise InvalidRequest(
                    "role applies in disaggregated mode only (scheduler.mode)", param="role"
                )
            return "unified"
        if role not in (None, "prefill", "decode"):
            raise InvalidRequest('role must be "prefill" or "decode"', param="role")
        return role or "decode"

    def _on_ready(self, worker: PoolWorker) -> None:
        """`worker` joined the rotation (engine/pool_watchdog.py): it gets the live
        settings if they changed since the server started."""
        if self._reconfigured:
            self._push_settings(worker)

    def _worker_config(self, worker: PoolWorker, input_address: str, health: str) -> WorkerConfig:
        scheduler = self.settings.scheduler.model_copy(update={"max_batch_tokens": self._n_batch})
        # NOTE: the CPU threads of a worker started by `scale` (or a restart after it) are
        # cores / the current count, unless runtime.n_threads sets them.
        num_workers = self._pool.num_active()
        runtime = self.settings.runtime.model_copy(update={"workers": max(1, num_workers)})
        config = worker_config(
            self.settings.model_copy(update={"scheduler": scheduler, "runtime": runtime}),
            self.model_info,
            worker_id=worker.worker_id,
            generation=worker.generation,
            input_address=input_address,
            output_address=self._pool.output_path,
            exit_with_parent=not self.settings.runtime.in_process,
            health_address=health,
        )
        if worker.role != "unified":
            config = self._with_role(config, worker.role, num_workers)
        if worker.cpu_fallback is None:
            return config
        return dataclasses.replace(config, cpu_fallback_reason=worker.cpu_fallback)

    def _with_role(self, config: WorkerConfig, role: str, num_workers: int) -> WorkerConfig:
        """A prefill or decode worker's config: its pool's threads and CPUs
        (scheduler.disaggregated). Unset threads share the pool's CPUs among its workers,
        or with no CPUs named, the machine's cores among all workers."""
        settings = self.settings.scheduler.disaggregated
        cpus = settings.prefill_cpus if role == "prefill" else settings.decode_cpus
        threads = settings.prefill_threads if role == "prefill" else settings.decode_threads
        if threads is None:
            threads = self.settings.runtime.n_threads
        if threads is None:
            share = max(1, self._pool.num_active(role)) if cpus else max(1, num_workers)
            threads = max(1, (len(cpus) or os.cpu_count() or 1) // share)
        context = dataclasses.replace(config.context, n_threads=threads, n_threads_batch=threads)
        return dataclasses.replace(config, context=context, role=role, cpus=tuple(cpus))


def make_engine_client(settings: Settings, model_info: ModelInfo) -> EngineClient:
    """The EngineClient for these settings (worker processes, or threads if in_process)."""
    return WorkerPoolClient(settings, model_info)
