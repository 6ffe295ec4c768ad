"""`PoolWatchdog`: notices dead and hung workers of a `WorkerPool` and replaces them.

Owns: the watchdog loop (a tick every `_WATCHDOG_S`), health pings to loaded workers and
what their answers mean (a new or replaced worker joins the rotation once it answered a
ping), a dead worker (its process gone) and a hung one (alive but not answering pings
within `runtime.worker_hang_timeout_s`, or stuck in one step longer than
`runtime.worker_step_timeout_s`: the rule is engine/worker_health.py's), and restarting
either after a delay (exponential while it fails to load). Does not own: failing the
requests a worker held (a callback: the client owns the request queues), the sockets and
processes themselves (engine/worker_pool.py), nor removed workers (engine/pool_scaling.py:
a draining worker that dies or hangs is not replaced).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

import zmq

from inferflux.config.settings import RuntimeSettings
from inferflux.engine.messages import Ping, encode
from inferflux.engine.worker_pool import PoolWorker, WorkerPool
from inferflux.errors import EngineDeadError

logger = logging.getLogger(__name__)

_WATCHDOG_S = 0.2
_MAX_RESTART_DELAY_S = 30.0


class PoolWatchdog:
    """Keeps `pool`'s workers alive. `fail_in_flight(worker, error)` fails what a dead
    or hung worker held; `on_ready(worker)` runs when a worker joins the rotation."""

    def __init__(
        self,
        pool: WorkerPool,
        runtime: RuntimeSettings,
        *,
        fail_in_flight: Callable[[PoolWorker, Exception], None],
        on_ready: Callable[[PoolWorker], None],
    ) -> None:
        self._pool = pool
        self._runtime = runtime
        self._fail_in_flight = fail_in_flight
        self._on_ready = on_ready

    async def run(self) -> None:
        """The watchdog loop, until the pool closes."""
        pool = self._pool
        while not pool.closing:
            await asyncio.sleep(_WATCHDOG_S)
            now = time.monotonic()
            for worker in list(pool.workers.values()):
                if pool.closing or worker.stopping:
                    continue
                if worker.restart_at:
                    if now >= worker.restart_at:
                        worker.restart_at = 0.0
                        pool.spawn(worker)
                elif not worker.alive():
                    self._on_worker_died(worker, now)
                elif worker.loaded:
                    self._check_health(worker, now)

    # -- pings ----------------------------------------------------------------------------
    def ping(self, worker: PoolWorker) -> None:
        """Send a health ping unless one is outstanding (answered between steps)."""
        seq = worker.health.next_ping(time.monotonic())
        if seq is None or worker.health_socket is None:
            return
        try:
            worker.health_socket.send(encode(Ping(seq)), zmq.NOBLOCK)
        except zmq.ZMQError:
            # NOTE: no peer (yet): the heartbeat is still connecting, or the process is
            # gone (the watchdog sees that). Not outstanding: pinged again next tick.
            worker.health.unsent()

    def answered(self, worker: PoolWorker, seq: int, busy_s: float) -> None:
        """A `Pong` from `worker`. One that answers the outstanding ping is a health
        check: a loaded worker that is not in rotation joins it (a new or replaced
        worker, after WorkerReady and one answered ping)."""
        if not worker.health.answered(seq, busy_s, time.monotonic()):
            return
        if not worker.loaded or worker.ready or worker.draining or self._pool.closing:
            return
        worker.ready = True
        logger.info("worker %d ready (pid %s)", worker.worker_id, worker.pid)
        self._on_ready(worker)

    def _check_health(self, worker: PoolWorker, now: float) -> None:
        """One watchdog tick for a loaded worker: ping it, or take it down when hung."""
        runtime = self._runtime
        reason = worker.health.hang(
            now, runtime.worker_hang_timeout_s, runtime.worker_step_timeout_s
        )
        if reason is not None:
            self._on_worker_hung(worker, now, reason)
        else:
            self.ping(worker)

    # -- taking a worker down -------------------------------------------------------------
    def _on_worker_hung(self, worker: PoolWorker, now: float, reason: str) -> None:
        """Out of rotation, its requests failed (unstarted ones are resubmitted by
        `generate`), the process killed, a replacement scheduled.

        NOTE: in in-process mode a thread cannot be killed: the hung thread is abandoned
        (its messages carry an old generation and are ignored; it keeps its memory) and a
        new thread replaces it.
        """
        held = sorted(worker.in_flight)
        worker.health.hangs += 1
        logger.error(
            "worker %d (pid %s) hung: %s; it held %d requests %s; killing and replacing it",
            worker.worker_id,
            worker.pid,
            reason,
            len(held),
            held[:8],
        )
        worker.ready = worker.loaded = False
        error = EngineDeadError("the engine worker stopped responding; retry the request")
        self._fail_in_flight(worker, error)
        if worker.process is not None:
            worker.process.kill()  # SIGKILL: a stopped (SIGSTOP) process dies too
        if worker.draining:
            worker.stopping = True  # being removed: no replacement
            return
        worker.restarts += 1
        worker.restart_at = now  # at the next tick

    def _count_gpu_crash(self, worker: PoolWorker, now: float, exitcode: int | None) -> None:
        """A worker that crashed with GPU layers `runtime.gpu_fallback_after_crashes` times
        (within offload.CRASH_WINDOW_S) is restarted on CPU from now on (its next
        WorkerConfig says why: engine/client.py). Not crashes: a worker that reported a
        failed load (`failed`; the load already fell back in the worker) and SIGKILL (an
        operator, the OOM killer: the CPU would not help)."""
        runtime = self._runtime
        if not runtime.gpu_fallback or runtime.n_gpu_layers == 0 or worker.cpu_fallback:
            return
        if worker.failed is not None or exitcode == -signal.SIGKILL:
            return
        if worker.gpu_crashes.record(now, after=runtime.gpu_fallback_after_crashes):
            worker.cpu_fallback = worker.gpu_crashes.reason(exitcode)
            logger.warning(
                "GPU → CPU fallback: worker %d %s", worker.worker_id, worker.cpu_fallback
            )

    def _on_worker_died(self, worker: PoolWorker, now: float) -> None:
        exitcode = worker.process.exitcode if worker.process is not None else None
        logger.error(
            "worker %d (pid %s) died (exit code %s); failing %d in-flight requests and restarting",
            worker.worker_id,
            worker.pid,
            exitcode,
            len(worker.in_flight),
        )
        worker.ready = worker.loaded = False
        self._fail_in_flight(worker, EngineDeadError("the engine worker died; retry the request"))
        if worker.draining:
            worker.stopping = True  # being removed: no replacement
            return
        self._count_gpu_crash(worker, now, exitcode)
        worker.restarts += 1
        delay = 0.0 if worker.failed is None else min(2.0**worker.restarts, _MAX_RESTART_DELAY_S)
        worker.restart_at = now + delay
