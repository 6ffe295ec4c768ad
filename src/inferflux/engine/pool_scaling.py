"""`PoolScaler`: runtime scaling of a `WorkerPool` (`EngineClient.scale`, REQ-7.5).

Owns: adding workers (each with a new id; `scale` waits until they are ready or failed,
up to `runtime.worker_start_timeout_s`), removing workers (out of rotation at once, the
never-ready and least busy first), and retiring removed ones in the background: they
finish their requests (up to `runtime.worker_drain_timeout_s`), what is left fails with
EngineDeadError (`generate` resubmits an unstarted request), then they stop and leave the
pool. Changes run one at a time. Does not own: failing requests (a callback: the client
owns the request queues), starting or stopping processes (engine/worker_pool.py), nor a
removed worker that dies or hangs meanwhile (engine/pool_watchdog.py marks it stopping).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from inferflux.config.settings import RuntimeSettings
from inferflux.engine.protocol import MAX_WORKERS
from inferflux.engine.worker_pool import PoolWorker, WorkerPool
from inferflux.errors import EngineDeadError, InvalidRequest

logger = logging.getLogger(__name__)


class PoolScaler:
    """Grows and shrinks `pool`; `fail_in_flight(worker, error)` fails what a removed
    worker still held when its drain deadline passed."""

    def __init__(
        self,
        pool: WorkerPool,
        runtime: RuntimeSettings,
        *,
        fail_in_flight: Callable[[PoolWorker, Exception], None],
    ) -> None:
        self._pool = pool
        self._runtime = runtime
        self._fail_in_flight = fail_in_flight
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()

    async def scale(self, num_workers: int, role: str = "unified") -> None:
        """Run `num_workers` workers of `role` from now on (engine/protocol.py has the
        contract). Changes run one at a time; the removed workers drain in the background."""
        if not 1 <= num_workers <= MAX_WORKERS:
            raise InvalidRequest(
                f"workers must be 1..{MAX_WORKERS}, not {num_workers}", param="workers"
            )
        async with self._lock:
            active = [w for w in self._pool.workers.values() if not w.draining and w.role == role]
            if num_workers > len(active):
                added = [self._pool.add(role) for _ in range(num_workers - len(active))]
                await self._wait_loaded(added)
            elif num_workers < len(active):
                # out of rotation first: never ready, then the fewest in flight
                by_cost = sorted(active, key=lambda w: (w.ready, len(w.in_flight)))
                self._remove(by_cost[: len(active) - num_workers])
            logger.info("%s workers scaled from %d to %d", role, len(active), num_workers)

    def cancel(self) -> None:
        """The server stops: give up on the drains in progress (shutdown stops them all)."""
        for task in list(self._retiring):
            task.cancel()

    async def _wait_loaded(self, workers: list[PoolWorker]) -> None:
        """Wait until each of `workers` is ready or failed, up to worker_start_timeout_s
        (the ones still loading join the rotation when they are ready)."""
        deadline = time.monotonic() + self._runtime.worker_start_timeout_s
        while time.monotonic() < deadline and not self._pool.closing:
            if all(w.ready or w.failed for w in workers):
                return
            await asyncio.sleep(0.05)

    def _remove(self, workers: list[PoolWorker]) -> None:
        for worker in workers:
            worker.draining, worker.ready = True, False
            logger.info(
                "worker %d (pid %s) removed: draining %d requests",
                worker.worker_id,
                worker.pid,
                len(worker.in_flight),
            )
        task = asyncio.create_task(self._retire(workers), name="engine-retire")
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, workers: list[PoolWorker]) -> None:
        """Let `workers` finish their requests (up to runtime.worker_drain_timeout_s), fail
        what is left (EngineDeadError: `generate` resubmits an unstarted request), then
        stop them and forget them."""
        deadline = time.monotonic() + self._runtime.worker_drain_timeout_s
        while any(w.in_flight for w in workers) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for worker in workers:
            if worker.in_flight:
                logger.warning(
                    "worker %d: %d requests left after runtime.worker_drain_timeout_s; "
                    "failing them",
                    worker.worker_id,
                    len(worker.in_flight),
                )
                error = EngineDeadError("the engine worker was removed; retry the request")
                self._fail_in_flight(worker, error)
            worker.stopping = True
        await self._pool.stop(workers)
        self._pool.forget(workers)
        for worker in workers:
            logger.info("worker %d (pid %s) stopped", worker.worker_id, worker.pid)
