"""`WorkerPoolClient`: the API process's `EngineClient` over worker processes (or threads).

Owns: spawning workers, sending each request to the ready worker its router picks
(`scheduler.routing`, engine/routing.py), one receive loop that dispatches every
`StepOutputs` delta to its request's asyncio.Queue, and a watchdog that notices a dead
worker within `_WATCHDOG_S`, fails its in-flight requests with EngineDeadError, and
starts a replacement. Does not own: engine logic.

Channels: every worker connects to one Unix stream socket the API listens on and sends
its output there as length-prefixed frames (frames.py: the event loop reads them
directly, with no I/O threads in between). The API sends requests over one ZeroMQ PUSH
socket per worker generation (a replacement gets a fresh address, so nothing queued for
the dead worker reaches the new one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from inferflux.config.settings import ObservabilitySettings, SchedulerSettings, Settings
from inferflux.engine.frames import FrameReader
from inferflux.engine.messages import (
    AbortRequests,
    AddRequest,
    EmbedRequest,
    EmbedResult,
    EngineStats,
    FinishReason,
    Reconfigure,
    RequestDelta,
    Shutdown,
    StepOutputs,
    StepStats,
    WorkerFailed,
    WorkerReady,
    decode_output,
    encode,
)
from inferflux.engine.protocol import EmbeddingResult, EngineClient, ModelInfo, WorkerStatus
from inferflux.engine.routing import RouteRequest, WorkerLoad, make_worker_router
from inferflux.engine.worker import WorkerConfig, run_worker, worker_config, worker_process_main
from inferflux.errors import (
    EngineDeadError,
    EngineError,
    ModelLoadError,
    QueueFull,
    QueueTimeout,
)

logger = logging.getLogger(__name__)

_WATCHDOG_S = 0.2
_MAX_RESTART_DELAY_S = 30.0
_MAX_RESUBMITS = 2
_RESUBMIT_WAIT_S = 30.0
# A worker told to shut down aborts its requests and exits after its current step; one
# still alive after this long is killed (it holds nothing worth saving), so that a
# graceful stop fits the last part of server.shutdown_grace_s (api/drain.py).
SHUTDOWN_JOIN_S = 1.0
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


@dataclass(slots=True, eq=False)
class _Worker:
    worker_id: int
    generation: int = 0
    socket: zmq.Socket[bytes] | None = None
    process: mp.process.BaseProcess | None = None
    thread: threading.Thread | None = None
    pid: int | None = None
    ready: bool = False
    failed: str | None = None
    restarts: int = 0
    restart_at: float = 0.0
    in_flight: set[str] = field(default_factory=set)
    stats: EngineStats = field(default_factory=EngineStats)
    load_s: float | None = None  # model load time reported by the latest WorkerReady

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.is_alive()
        return self.thread is not None and self.thread.is_alive()


def _load(worker: _Worker) -> WorkerLoad:
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
    if last.finish_reason not in _CACHED_FINISHES:
        return None
    return request.prompt_token_ids + output[:-1]


class WorkerPoolClient:
    """EngineClient over `settings.runtime.workers` engine workers."""

    def __init__(self, settings: Settings, model_info: ModelInfo) -> None:
        self.settings = settings
        self.model_info = model_info
        self._in_process = settings.runtime.in_process
        self._workers = [_Worker(worker_id=i) for i in range(settings.runtime.workers)]
        self._queues: dict[str, tuple[asyncio.Queue[RequestDelta | Exception], _Worker]] = {}
        self._embeds: dict[str, tuple[asyncio.Future[EmbedResult], _Worker]] = {}
        self._zmq: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._ipc_dir = ""
        self._output: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._backpressure = False
        self._step_observers: list[Callable[[int, StepStats], None]] = []
        self._n_batch = settings.scheduler.max_batch_tokens  # the contexts' batch, for good
        self._reconfigured = False  # a live change happened: workers get it once ready
        self._router = make_worker_router()  # reads settings.scheduler.routing per request

    # -- EngineClient -----------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return any(w.ready for w in self._workers)

    async def start(self) -> None:
        self._ipc_dir = tempfile.mkdtemp(prefix="inferflux-ipc-")
        self._output = await asyncio.get_running_loop().create_unix_server(
            lambda: FrameReader(self._on_output), path=self._output_path()
        )
        for worker in self._workers:
            self._spawn(worker)
        self._tasks = [asyncio.create_task(self._watchdog(), name="engine-watchdog")]
        await self._wait_first_ready()

    async def _wait_first_ready(self) -> None:
        deadline = time.monotonic() + self.settings.runtime.worker_start_timeout_s
        while not self.ready:
            failures = [w.failed for w in self._workers if w.failed]
            if len(failures) == len(self._workers):
                raise ModelLoadError(f"no worker could load the model: {failures[0]}")
            if time.monotonic() > deadline:
                raise ModelLoadError("no worker became ready within runtime.worker_start_timeout_s")
            await asyncio.sleep(0.02)

    async def shutdown(self) -> None:
        self._closing = True
        for worker in self._workers:
            worker.ready = False  # late requests get NoWorkerReady (503), not a dead socket
            if worker.alive():
                with contextlib.suppress(EngineDeadError):
                    await self._send(worker, encode(Shutdown()))
        await asyncio.to_thread(self._join_all, SHUTDOWN_JOIN_S)
        for task in self._tasks:
            task.cancel()
        for worker in self._workers:
            self._fail_in_flight(worker, EngineDeadError("the server is shutting down"))
            if worker.socket is not None:
                worker.socket.close(linger=0)
        if self._output is not None:
            self._output.close()
        self._zmq.term()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    async def generate(self, request: AddRequest) -> AsyncIterator[RequestDelta]:
        # NOTE: a worker can die before the watchdog notices; a request it had not
        # produced anything for yet is resubmitted to another ready worker (spec REQ 9.4).
        # One that already streamed output fails: its sampling state died with the worker.
        self._check_backpressure()
        for attempt in range(_MAX_RESUBMITS + 1):
            worker = self._pick_worker(request)
            produced = False
            try:
                async for delta in self._generate_on(worker, request):
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
                if produced or attempt == _MAX_RESUBMITS or self._closing:
                    raise
                logger.warning("resubmitting %s after its worker died", request.request_id)
                await self._wait_ready(_RESUBMIT_WAIT_S)

    def queue_depth(self) -> int:
        """Requests submitted and not running yet (queued in a worker, or on the way)."""
        in_flight = sum(len(w.in_flight) for w in self._workers)
        return max(0, in_flight - sum(w.stats.num_running for w in self._workers))

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
        self, worker: _Worker, request: AddRequest
    ) -> AsyncIterator[RequestDelta]:
        queue: asyncio.Queue[RequestDelta | Exception] = asyncio.Queue()
        request_id = request.request_id
        self._queues[request_id] = (queue, worker)
        worker.in_flight.add(request_id)
        finished = False
        last = RequestDelta(request_id=request_id)
        output: list[int] = []  # what the worker's prefix cache keeps: prompt + output
        try:
            await self._send(worker, encode(request))
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
            self._router.finish(request_id, _cached_tokens(request, last, output))
            if not finished:
                await self._send_abort(worker, request_id)

    async def _wait_ready(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for any worker to be ready (returns either way)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def abort(self, request_id: str) -> None:
        """Abort the request in its worker and end its stream now with an ABORT delta:
        the worker's own comes only after its current step (and is then dropped)."""
        entry = self._queues.get(request_id)
        if entry is not None:
            await self._send_abort(entry[1], request_id)
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
            )
            for w in self._workers
        ]

    def observe_steps(self, observer: Callable[[int, StepStats], None]) -> None:
        self._step_observers.append(observer)

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
        for worker in self._workers:
            if worker.ready:
                self._push_settings(worker)

    def _push_settings(self, worker: _Worker) -> None:
        message = Reconfigure(
            scheduler=self.settings.scheduler.model_dump(mode="json"),
            observability=self.settings.observability.model_dump(mode="json"),
        )
        if worker.socket is not None:
            with contextlib.suppress(zmq.ZMQError):  # gone: it restarts and gets them then
                worker.socket.send(encode(message), zmq.NOBLOCK)

    # -- routing and dispatch -------------------------------------------------------------
    def _pick_worker(self, request: AddRequest | None = None) -> _Worker:
        """The worker for `request` by `scheduler.routing` (engine/routing.py), read now so
        a live change applies at once; the least-loaded one for an embedding (None)."""
        loads = [_load(w) for w in self._workers]
        if request is None:
            worker_id = self._router.route_any(loads)
        else:
            route = RouteRequest(
                request.request_id,
                request.prompt_token_ids,
                request.sampling.max_tokens,
                request.cache_namespace,
            )
            worker_id = self._router.route(route, loads, self.settings.scheduler).worker_id
        return next(w for w in self._workers if w.worker_id == worker_id)

    def _forget(self, request_id: str) -> None:
        entry = self._queues.pop(request_id, None)
        if entry is not None:
            entry[1].in_flight.discard(request_id)

    async def _send(self, worker: _Worker, data: bytes) -> None:
        """Queue `data` for `worker` without ever blocking.

        NOTE: a PUSH socket whose peer is gone blocks `send` until a peer connects, and
        closing it then cancels the send. NOBLOCK with no high-water mark fails fast
        instead: no peer → EngineDeadError, which `generate` resubmits elsewhere.
        """
        if worker.socket is None:
            raise EngineDeadError("the engine worker is not running")
        try:
            worker.socket.send(data, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            worker.ready = False  # the watchdog restarts it once the process is gone
            raise EngineDeadError(f"the engine worker is unreachable: {exc}") from None

    async def _send_abort(self, worker: _Worker, request_id: str) -> None:
        if worker.ready:
            with contextlib.suppress(EngineDeadError):
                await self._send(worker, encode(AbortRequests([request_id])))

    def _on_output(self, data: bytes) -> None:
        """One message from a worker's output channel (called by the event loop)."""
        message = decode_output(data)
        worker = self._workers[message.worker_id]
        if message.generation != worker.generation:
            return  # from a worker that has been replaced
        if isinstance(message, StepOutputs):
            worker.stats = message.stats
            if message.step is not None:
                self._observe_step(worker.worker_id, message.step)
            self._dispatch(message.deltas)
        elif isinstance(message, WorkerReady):
            worker.ready, worker.pid, worker.failed = True, message.pid, None
            worker.load_s = message.load_s
            logger.info("worker %d ready (pid %d)", worker.worker_id, message.pid)
            if self._reconfigured:
                self._push_settings(worker)
        elif isinstance(message, WorkerFailed):
            worker.failed = message.message
        elif isinstance(message, EmbedResult):
            self._resolve_embed(message)

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

    def _fail_in_flight(self, worker: _Worker, error: Exception) -> None:
        for request_id in list(worker.in_flight):
            entry = self._queues.get(request_id)
            if entry is not None:
                entry[0].put_nowait(error)
        self._fail_embeds(worker, error)
        worker.in_flight.clear()

    # -- embeddings -----------------------------------------------------------------------
    async def embed(self, inputs: list[list[int]], *, normalize: bool = True) -> EmbeddingResult:
        request = EmbedRequest(
            request_id=f"embd-{uuid.uuid4().hex}", inputs=inputs, normalize=normalize
        )
        data = encode(request)
        # NOTE: embedding is idempotent: a request whose worker died is resubmitted to
        # another ready worker (spec REQ 9.4), as `generate` does before any output.
        attempt = 0
        while True:
            try:
                result = await self._embed_on(self._pick_worker(), request.request_id, data)
            except EngineDeadError:
                attempt += 1
                if attempt > _MAX_RESUBMITS or self._closing:
                    raise
                logger.warning("resubmitting %s after its worker died", request.request_id)
                await self._wait_ready(_RESUBMIT_WAIT_S)
                continue
            vectors = np.frombuffer(result.embeddings, dtype="<f4").reshape(-1, result.n_embd)
            return EmbeddingResult(vectors=vectors.tolist(), num_prompt_tokens=result.num_tokens)

    async def _embed_on(self, worker: _Worker, request_id: str, data: bytes) -> EmbedResult:
        future: asyncio.Future[EmbedResult] = asyncio.get_running_loop().create_future()
        self._embeds[request_id] = (future, worker)
        worker.in_flight.add(request_id)
        try:
            await self._send(worker, data)
            return await future
        finally:
            self._embeds.pop(request_id, None)
            worker.in_flight.discard(request_id)
            if not future.done() or future.cancelled():  # the caller gave up: drop it there
                await self._send_abort(worker, request_id)

    def _resolve_embed(self, message: EmbedResult) -> None:
        entry = self._embeds.get(message.request_id)
        if entry is None or entry[0].done():
            return
        if message.error is not None:
            error = EngineError(f"embedding failed in the engine: {message.error}")
            entry[0].set_exception(error)
        else:
            entry[0].set_result(message)

    def _fail_embeds(self, worker: _Worker, error: Exception) -> None:
        for future, owner in list(self._embeds.values()):
            if owner is worker and not future.done():
                future.set_exception(error)

    # -- worker lifecycle -----------------------------------------------------------------
    async def _watchdog(self) -> None:
        while not self._closing:
            await asyncio.sleep(_WATCHDOG_S)
            now = time.monotonic()
            for worker in self._workers:
                if worker.restart_at and now >= worker.restart_at and not self._closing:
                    worker.restart_at = 0.0
                    self._spawn(worker)
                elif not worker.restart_at and not worker.alive() and not self._closing:
                    self._on_worker_died(worker, now)

    def _on_worker_died(self, worker: _Worker, now: float) -> None:
        exitcode = worker.process.exitcode if worker.process is not None else None
        logger.error(
            "worker %d (pid %s) died (exit code %s); failing %d in-flight requests and restarting",
            worker.worker_id,
            worker.pid,
            exitcode,
            len(worker.in_flight),
        )
        worker.ready = False
        self._fail_in_flight(worker, EngineDeadError("the engine worker died; retry the request"))
        worker.restarts += 1
        delay = 0.0 if worker.failed is None else min(2.0**worker.restarts, _MAX_RESTART_DELAY_S)
        worker.restart_at = now + delay

    def _spawn(self, worker: _Worker) -> None:
        if worker.socket is not None:
            worker.socket.close(linger=0)
        worker.generation += 1
        worker.ready, worker.pid = False, None
        address = f"ipc://{self._ipc_dir}/in-{worker.worker_id}-{worker.generation}"
        worker.socket = self._zmq.socket(zmq.PUSH)
        worker.socket.setsockopt(zmq.SNDHWM, 0)
        worker.socket.bind(address)
        config = self._worker_config(worker, address)
        if self._in_process:
            worker.thread = threading.Thread(
                target=run_worker, args=(config,), name=f"engine-{worker.worker_id}", daemon=True
            )
            worker.thread.start()
            worker.pid = os.getpid()
            return
        worker.process = mp.get_context("spawn").Process(
            target=worker_process_main,
            args=(config,),
            name=f"inferflux-worker-{worker.worker_id}",
            daemon=True,
        )
        worker.process.start()
        worker.pid = worker.process.pid

    def _output_path(self) -> str:
        return os.path.join(self._ipc_dir, "out.sock")

    def _worker_config(self, worker: _Worker, input_address: str) -> WorkerConfig:
        scheduler = self.settings.scheduler.model_copy(update={"max_batch_tokens": self._n_batch})
        return worker_config(
            self.settings.model_copy(update={"scheduler": scheduler}),
            self.model_info,
            worker_id=worker.worker_id,
            generation=worker.generation,
            input_address=input_address,
            output_address=self._output_path(),
            exit_with_parent=not self._in_process,
        )

    def _join_all(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for worker in self._workers:
            remaining = max(0.0, deadline - time.monotonic())
            if worker.process is not None:
                worker.process.join(remaining)
                if worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join(1.0)
            elif worker.thread is not None:
                worker.thread.join(remaining)


def make_engine_client(settings: Settings, model_info: ModelInfo) -> EngineClient:
    """The EngineClient for these settings (worker processes, or threads if in_process)."""
    return WorkerPoolClient(settings, model_info)
