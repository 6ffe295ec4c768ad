"""`PoolWatchdog` and `PoolScaler` decisions that need no running worker: when an answered
ping puts a worker in rotation, and which worker counts `scale` refuses. Starting,
killing and replacing real workers: tests/integration/test_worker_health.py and
test_worker_scaling.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferflux.config.settings import RuntimeSettings
from inferflux.engine.pool_scaling import PoolScaler
from inferflux.engine.pool_watchdog import PoolWatchdog
from inferflux.engine.protocol import MAX_WORKERS
from inferflux.engine.worker_pool import PoolWorker, WorkerPool
from inferflux.errors import InvalidRequest


def _no_config(worker, input_address, health):
    raise AssertionError("nothing is spawned in these tests")


@pytest.fixture
def pool() -> Iterator[WorkerPool]:
    pool = WorkerPool(["unified"] * 2, in_process=True, config=_no_config)
    yield pool
    pool.close()


class Joined:
    def __init__(self) -> None:
        self.workers: list[int] = []

    def __call__(self, worker: PoolWorker) -> None:
        self.workers.append(worker.worker_id)


def watchdog(pool: WorkerPool, joined: Joined) -> PoolWatchdog:
    return PoolWatchdog(
        pool, RuntimeSettings(), fail_in_flight=lambda worker, error: None, on_ready=joined
    )


def pinged(worker: PoolWorker, *, loaded: bool = True) -> int:
    """`worker` with a ping outstanding; its sequence number."""
    worker.loaded = loaded
    worker.health.reset(0.0)
    seq = worker.health.next_ping(0.1)
    assert seq is not None
    return seq


def test_a_loaded_worker_joins_the_rotation_when_it_answers_the_ping(pool) -> None:
    joined = Joined()
    worker = pool.workers[0]
    watchdog(pool, joined).answered(worker, pinged(worker), 0.0)
    assert worker.ready and joined.workers == [0]
    assert pool.ready


def test_a_stale_pong_puts_no_worker_in_rotation(pool) -> None:
    joined = Joined()
    worker = pool.workers[0]
    seq = pinged(worker)
    watchdog(pool, joined).answered(worker, seq - 1, 0.0)
    assert not worker.ready and joined.workers == []


@pytest.mark.parametrize("state", ["not_loaded", "draining", "closing"])
def test_no_worker_joins_while_loading_draining_or_closing(pool, state: str) -> None:
    joined = Joined()
    worker = pool.workers[1]
    seq = pinged(worker, loaded=state != "not_loaded")
    worker.draining = state == "draining"
    pool.closing = state == "closing"
    watchdog(pool, joined).answered(worker, seq, 0.0)
    assert not worker.ready and joined.workers == []


def test_a_ready_worker_answering_again_joins_only_once(pool) -> None:
    joined = Joined()
    dog = watchdog(pool, joined)
    worker = pool.workers[0]
    dog.answered(worker, pinged(worker), 0.0)
    dog.answered(worker, pinged(worker), 0.0)
    assert joined.workers == [0]


def test_draining_workers_do_not_count_as_active(pool) -> None:
    assert pool.num_active() == 2
    pool.workers[1].draining = True
    assert pool.num_active() == 1


@pytest.mark.parametrize("num_workers", [0, -1, MAX_WORKERS + 1])
async def test_scale_refuses_a_count_out_of_range(pool, num_workers: int) -> None:
    scaler = PoolScaler(pool, RuntimeSettings(), fail_in_flight=lambda worker, error: None)
    with pytest.raises(InvalidRequest, match=f"workers must be 1..{MAX_WORKERS}"):
        await scaler.scale(num_workers)
    assert sorted(pool.workers) == [0, 1]


def gpu_watchdog(pool: WorkerPool, **runtime: object) -> PoolWatchdog:
    settings = RuntimeSettings.model_validate({"n_gpu_layers": -1, **runtime})
    return PoolWatchdog(
        pool, settings, fail_in_flight=lambda worker, error: None, on_ready=Joined()
    )


def test_a_gpu_worker_that_dies_repeatedly_is_restarted_on_cpu(pool, caplog) -> None:
    dog = gpu_watchdog(pool, gpu_fallback_after_crashes=3)
    worker = pool.workers[0]
    for now in (1.0, 2.0):
        dog._on_worker_died(worker, now)
        assert worker.cpu_fallback is None
    dog._on_worker_died(worker, 3.0)
    assert worker.cpu_fallback is not None and "3 times" in worker.cpu_fallback
    assert worker.restarts == 3 and pool.workers[1].cpu_fallback is None
    assert any("GPU → CPU fallback" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("runtime", [{"gpu_fallback": False}, {"n_gpu_layers": 0}])
def test_no_cpu_restart_without_fallback_or_gpu_layers(pool, runtime) -> None:
    dog = gpu_watchdog(pool, gpu_fallback_after_crashes=1, **runtime)
    worker = pool.workers[0]
    dog._on_worker_died(worker, 1.0)
    assert worker.cpu_fallback is None and worker.restarts == 1


def test_failed_loads_and_sigkills_are_no_gpu_crashes(pool) -> None:
    """A worker that reported a failed load already fell back in the worker; SIGKILL (an
    operator, the OOM killer) is not the GPU's doing."""
    dog = gpu_watchdog(pool, gpu_fallback_after_crashes=1)
    failed, killed = pool.workers[0], pool.workers[1]
    failed.failed = "llama.cpp could not load m.gguf"
    dog._on_worker_died(failed, 1.0)

    class Killed:
        exitcode = -9

        def is_alive(self) -> bool:
            return False

    killed.process = Killed()
    dog._on_worker_died(killed, 1.0)
    assert failed.cpu_fallback is None and killed.cpu_fallback is None
