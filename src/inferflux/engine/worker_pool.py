"""`WorkerPool`: one model's engine workers by id, and the plumbing to each of them.

Owns: the `PoolWorker` records (keyed by `worker_id`; ids are never reused in one
server's life: a replacement keeps its slot's id, an added worker gets a new one), the
IPC directory with the output socket every worker sends to, starting a worker's process
(or thread) with a fresh pair of PUSH sockets per generation, sending to it without ever
blocking, and stopping and joining workers. Does not own: what goes over the sockets or
when a worker is started, replaced or removed (engine/client.py, engine/pool_watchdog.py,
engine/pool_scaling.py), nor a worker's `WorkerConfig` (the client builds it: a callback).

Channels: every worker connects to one Unix stream socket the pool listens on and sends
its output there as length-prefixed frames (frames.py: the event loop reads them
directly, with no I/O threads in between). The pool sends requests over one ZeroMQ PUSH
socket per worker generation (a replacement gets a fresh address, so nothing queued for
the dead worker reaches the new one), and health pings over a second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import zmq

from inferflux.engine.backends.offload import CrashHistory
from inferflux.engine.engine_build import WorkerConfig
from inferflux.engine.frames import FrameReader
from inferflux.engine.messages import AbortRequests, EngineStats, Shutdown, encode
from inferflux.engine.worker import run_worker, worker_process_main
from inferflux.engine.worker_health import WorkerHealth
from inferflux.errors import EngineDeadError

# A worker told to shut down aborts its requests and exits after its current step; one
# still alive after this long is killed (it holds nothing worth saving), so that a
# graceful stop fits the last part of server.shutdown_grace_s (api/drain.py).
SHUTDOWN_JOIN_S = 1.0
# A request whose worker died before it produced anything is resubmitted this many times,
# each after waiting this long at most for a ready worker (spec REQ 9.4).
MAX_RESUBMITS = 2
RESUBMIT_WAIT_S = 30.0


@dataclass(slots=True, eq=False)
class PoolWorker:
    """One worker slot as the API process's event loop sees it (not thread-safe)."""

    worker_id: int
    generation: int = 0
    socket: zmq.Socket[bytes] | None = None
    health_socket: zmq.Socket[bytes] | None = None  # pings, to the worker's heartbeat
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
    loaded: bool = False  # WorkerReady came; `ready` once it answers a ping too
    health: WorkerHealth = field(default_factory=WorkerHealth)
    draining: bool = False  # removed by `scale`: out of rotation, finishing its requests
    stopping: bool = False  # told to shut down (drained): the watchdog leaves it alone
    backend: str = "cpu"  # where its model runs, per its latest WorkerReady
    requested_backend: str = "cpu"  # what runtime.n_gpu_layers asked for
    fallback_reason: str | None = None  # why backend != requested_backend
    gpu_crashes: CrashHistory = field(default_factory=CrashHistory)  # deaths on the GPU
    cpu_fallback: str | None = None  # set: restarted on CPU from now on (this is why)
    role: str = "unified"  # "prefill" | "decode" in disaggregated mode; kept on restart

    @property
    def serves(self) -> bool:
        """True when requests stream from this worker (not a prefill worker)."""
        return self.role != "prefill"

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.is_alive()
        return self.thread is not None and self.thread.is_alive()


# Builds the WorkerConfig of a worker about to start: (worker, input address, health address).
ConfigFactory = Callable[[PoolWorker, str, str], WorkerConfig]


class WorkerPool:
    """The workers of one `WorkerPoolClient` (see the module docstring). `closing` is set
    once the server stops: nothing is started or waited for after that."""

    def __init__(self, roles: list[str], *, in_process: bool, config: ConfigFactory) -> None:
        """One worker per entry of `roles` ("unified", or "prefill" / "decode")."""
        self.workers = {i: PoolWorker(worker_id=i, role=role) for i, role in enumerate(roles)}
        self.closing = False
        self._next_worker_id = len(roles)
        self._in_process = in_process
        self._config = config
        self.shutdown_join_s = SHUTDOWN_JOIN_S  # + the KV snapshot's budget (client.py)
        self._zmq: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._ipc_dir = ""
        self._output: asyncio.AbstractServer | None = None

    # -- the pool -----------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """True while a worker requests can stream from is ready (not a prefill worker:
        without one, a decode worker computes prompts itself)."""
        return any(w.ready and w.serves for w in self.workers.values())

    def num_active(self, role: str | None = None) -> int:
        """Workers not being removed (of `role` only, when given)."""
        return sum(1 for w in self.workers.values() if not w.draining and role in (None, w.role))

    @property
    def output_path(self) -> str:
        return os.path.join(self._ipc_dir, "out.sock")

    async def open(self, on_output: Callable[[bytes], None]) -> None:
        """Listen for the workers' output (each frame goes to `on_output`), then start
        every worker."""
        self._ipc_dir = tempfile.mkdtemp(prefix="inferflux-ipc-")
        self._output = await asyncio.get_running_loop().create_unix_server(
            lambda: FrameReader(on_output), path=self.output_path
        )
        for worker in self.workers.values():
            self.spawn(worker)

    def close(self) -> None:
        """Close every socket and remove the IPC directory (the workers are stopped)."""
        for worker in self.workers.values():
            close_sockets(worker)
        if self._output is not None:
            self._output.close()
        self._zmq.term()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for any worker to be ready (returns either way)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    # -- one worker ---------------------------------------------------------------------
    def add(self, role: str = "unified") -> PoolWorker:
        """A new worker, with a new id, started."""
        worker = PoolWorker(worker_id=self._next_worker_id, role=role)
        self._next_worker_id += 1
        self.workers[worker.worker_id] = worker
        self.spawn(worker)
        return worker

    def spawn(self, worker: PoolWorker) -> None:
        """Start (or restart) `worker`'s process or thread as a new generation."""
        close_sockets(worker)
        worker.generation += 1
        worker.ready, worker.loaded, worker.pid = False, False, None
        worker.health.reset(time.monotonic())
        name = f"{worker.worker_id}-{worker.generation}"
        address, health = f"ipc://{self._ipc_dir}/in-{name}", f"ipc://{self._ipc_dir}/health-{name}"
        worker.socket = self._push_socket(address)
        worker.health_socket = self._push_socket(health)
        config = self._config(worker, address, health)
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

    def _push_socket(self, address: str) -> zmq.Socket[bytes]:
        socket = self._zmq.socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.bind(address)
        return socket

    async def send(self, worker: PoolWorker, data: bytes) -> None:
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

    async def send_abort(self, worker: PoolWorker, request_id: str) -> None:
        """Abort `request_id` in `worker`, if it still takes messages."""
        if worker.ready or (worker.draining and not worker.stopping):
            with contextlib.suppress(EngineDeadError):
                await self.send(worker, encode(AbortRequests([request_id])))

    async def stop(self, workers: Iterable[PoolWorker]) -> None:
        """Tell `workers` to shut down, then wait for them to exit, together at most
        SHUTDOWN_JOIN_S; kill what is left."""
        stopped = list(workers)
        for worker in stopped:
            if worker.alive():
                with contextlib.suppress(EngineDeadError):
                    await self.send(worker, encode(Shutdown()))
        await asyncio.to_thread(_join, stopped, self.shutdown_join_s)

    def forget(self, workers: Iterable[PoolWorker]) -> None:
        """Close the sockets of stopped `workers` and drop them from the pool."""
        for worker in workers:
            close_sockets(worker)
            self.workers.pop(worker.worker_id, None)


def close_sockets(worker: PoolWorker) -> None:
    for socket in (worker.socket, worker.health_socket):
        if socket is not None:
            socket.close(linger=0)


def _join(workers: list[PoolWorker], timeout_s: float) -> None:
    """Wait for `workers` to exit, together at most `timeout_s`; kill what is left."""
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        remaining = max(0.0, deadline - time.monotonic())
        if worker.process is not None:
            worker.process.join(remaining)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(1.0)
        elif worker.thread is not None:
            worker.thread.join(remaining)
