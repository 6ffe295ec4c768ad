"""GPU faults (issue 22: "GPU fails → automatic CPU fallback"), simulated at the
backend-selection seam (engine/backends/offload.py) on a server asked for every layer on
the GPU (`runtime.n_gpu_layers: -1`), under 16 streams:

- the GPU backend fails to initialise (`INFERFLUX_FAULT_GPU_INIT=fail`): the worker loads
  on CPU at once;
- the GPU worker crashes at start (`INFERFLUX_FAULT_GPU_INIT=crash`: SIGSEGV, as the CUDA
  start-up crash did), again and again: after `runtime.gpu_fallback_after_crashes` (3)
  deaths the API process restarts it on CPU.

Either way the server must come up on CPU, say so (/server/stats, the backend metric) and
then serve the load with nothing failed or lost. The recovery time is from the server's
start to ready (the crash loop included). On a machine with a GPU the same rows run
against the real device; here the CPU build has none (the requested backend is `gpu`).
"""

from __future__ import annotations

import time

import httpx

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, StreamLoad, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import workers
from tests.integration.server_process import ServerProcess

READY_TARGET_S = 120.0  # model load + the crash loop (3 spawns) on a loaded 2-core machine
CRASHES = 3  # runtime.gpu_fallback_after_crashes (the default)


def _gpu_fault(run: ChaosRun, mode: str, title: str, reason: str, restarts: int) -> FaultResult:
    result = FaultResult(
        f"{title} ({run.streams} streams, n_gpu_layers -1)",
        target=f"serves on CPU, reported; ready ≤ {READY_TARGET_S:.0f} s; 0 failed, 0 lost",
        passed=True,
    )
    run.log_dir.mkdir(parents=True, exist_ok=True)
    env = {"INFERFLUX_RUNTIME__N_GPU_LAYERS": "-1", "INFERFLUX_FAULT_GPU_INIT": mode}
    started = time.monotonic()
    server = ServerProcess(env=env, log_path=run.log_dir / f"gpu-{mode}.log")
    try:
        server.wait_ready(READY_TARGET_S)
        result.recovery_s = time.monotonic() - started
        load = StreamLoad(server.url, LoadSpec(streams=run.streams)).start()
        time.sleep(run.seconds(12))
        result.count(tally(load.stop()))
        _check_reported(result, server.url, reason, restarts)
    except (RuntimeError, TimeoutError) as exc:
        result.check(False, f"ready on CPU: {exc}")
    finally:
        server.close()
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    result.check(result.failed == 0, "0 failed once ready")
    return result


def _check_reported(result: FaultResult, url: str, reason: str, restarts: int) -> None:
    """/server/stats and /metrics say the worker runs on CPU, and why."""
    (worker,) = workers(url)
    result.notes.append(
        f"backend {worker['backend']} (requested {worker['requested_backend']}), "
        f"{worker['restarts']} restarts: {worker['fallback_reason']}"
    )
    result.check(worker["backend"] == "cpu", "backend cpu in /server/stats")
    result.check(reason in (worker["fallback_reason"] or ""), "the reason in /server/stats")
    result.check(worker["restarts"] == restarts, f"{restarts} restarts")
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    sample = 'inferflux_worker_backend_info{backend="cpu",requested="gpu",worker="0"} 1.0'
    result.check(sample in metrics, "inferflux_worker_backend_info backend cpu")


def gpu_faults(run: ChaosRun) -> list[FaultResult]:
    """The two GPU faults, each on a server of its own."""
    results = []
    for mode, title, reason, restarts in (
        ("fail", "GPU backend fails to initialise", "failed to initialise", 0),
        ("crash", "GPU worker crashes at start, repeatedly", "restarted on CPU", CRASHES),
    ):
        started = time.monotonic()
        result = _gpu_fault(run, mode, title, reason, restarts)
        result.duration_s = time.monotonic() - started
        results.append(result)
    return results
