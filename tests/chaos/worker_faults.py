"""Worker faults under 16 streams on `inferflux serve --workers 2`: a worker killed (-9),
hung (SIGSTOP: the watchdog of engine/pool_watchdog.py must find it within
runtime.worker_hang_timeout_s and replace it), and slowed (CPU hogs beside it)."""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import time
from collections.abc import Callable
from typing import Any

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, StreamLoad, first_ok_after, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import cpu_hogs, serving, wait_until, workers

NUM_WORKERS = 2
HANG_TIMEOUT_S = 4.0  # runtime.worker_hang_timeout_s (the default)
DETECTION_TARGET_S = 8.0  # the deadline + the watchdog's ticks, on a loaded machine
REPLACE_TARGET_S = 60.0


def _worker(url: str, worker_id: int) -> dict[str, Any]:
    return next(w for w in workers(url) if w["worker_id"] == worker_id)


def _replaced(url: str, victim: dict[str, Any]) -> bool:
    worker = _worker(url, victim["worker_id"])
    return bool(worker["ready"]) and worker["pid"] != victim["pid"]


def _out_of_rotation(url: str, victim: dict[str, Any]) -> bool:
    worker = _worker(url, victim["worker_id"])
    return worker["pid"] != victim["pid"] or not worker["ready"]


def _busiest(url: str) -> dict[str, Any]:
    return max(workers(url), key=lambda w: int(w["num_in_flight"]))


def kill_under_load(
    run: ChaosRun, url: str, result: FaultResult, victim_of: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """Start the load, SIGKILL the worker `victim_of` picks once every stream runs, wait
    for its replacement (recovery time), let the load go on, and count it into `result`.
    Checks 0 lost and 0 500s, and the replacement; returns the victim as it was."""
    load = StreamLoad(url, LoadSpec(streams=run.streams)).start()
    load.wait_for(run.streams)
    victim = victim_of()
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    result.recovery_s = wait_until(lambda: _replaced(url, victim), 120)
    time.sleep(run.seconds(9))
    outcomes = load.stop()
    result.count(tally(outcomes))
    serving_again = first_ok_after(outcomes, killed_at)
    result.notes.append(
        f"victim held {victim['num_in_flight']} requests; first ok request sent after the kill "
        f"ended {serving_again if serving_again is None else round(serving_again, 2)} s after it"
    )
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    result.check(
        result.recovery_s is not None and result.recovery_s <= REPLACE_TARGET_S, "replaced"
    )
    return victim


def worker_killed(run: ChaosRun, url: str) -> FaultResult:
    """SIGKILL the busiest worker under load: only its streams may fail (cleanly)."""
    result = FaultResult(
        f"worker kill -9 ({run.streams} streams, {NUM_WORKERS} workers)",
        target="0 lost, 0 500s; failed ≤ streams on the victim; replaced ≤ "
        f"{REPLACE_TARGET_S:.0f} s",
        passed=True,
    )
    victim = kill_under_load(run, url, result, lambda: _busiest(url))
    result.check(result.failed <= max(int(victim["num_in_flight"]), 1), "failed ≤ in flight")
    return result


def worker_hung(run: ChaosRun, url: str) -> FaultResult:
    """SIGSTOP the busiest worker: detected by the watchdog, its started streams end with
    `worker_died`, its unstarted requests are resubmitted, it is killed and replaced."""
    result = FaultResult(
        f"worker hung: SIGSTOP ({run.streams} streams, {NUM_WORKERS} workers)",
        target=f"0 lost, 0 500s; detected ≤ {DETECTION_TARGET_S:.0f} s; replaced ≤ "
        f"{REPLACE_TARGET_S:.0f} s",
        passed=True,
    )
    wait_until(lambda: all(w["ready"] for w in workers(url)), 120)
    load = StreamLoad(url, LoadSpec(streams=run.streams)).start()
    load.wait_for(run.streams)
    victim = _busiest(url)
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        detected_s = wait_until(lambda: _out_of_rotation(url, victim), 30)
        result.recovery_s = wait_until(lambda: _replaced(url, victim), 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim["pid"], signal.SIGKILL)
    time.sleep(run.seconds(9))
    result.count(tally(load.stop()))
    result.notes.append(
        f"victim held {victim['num_in_flight']} requests; detected after "
        f"{detected_s if detected_s is None else round(detected_s, 2)} s "
        f"(runtime.worker_hang_timeout_s {HANG_TIMEOUT_S} s)"
    )
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    result.check(detected_s is not None and detected_s <= DETECTION_TARGET_S, "detection")
    result.check(
        result.recovery_s is not None and result.recovery_s <= REPLACE_TARGET_S, "replaced"
    )
    return result


def _rate_and_latency(outcomes: list[Any]) -> tuple[float, float]:
    """Requests ok per second and median latency of the ok ones."""
    done = [o for o in outcomes if o.kind == "ok"]
    if len(done) < 2:
        return 0.0, 0.0
    span_s = max(o.ended_at for o in done) - min(o.sent_at for o in done)
    return len(done) / span_s, statistics.median(o.ended_at - o.sent_at for o in done)


def worker_slowed(run: ChaosRun, url: str) -> FaultResult:
    """Busy-looping processes (2 per CPU) beside the workers: everything slows, nothing
    fails, and no healthy worker is taken for hung."""
    num_hogs = 2 * (os.cpu_count() or 1)
    result = FaultResult(
        f"workers slowed: {num_hogs} CPU hogs ({run.streams} streams)",
        target="0 failed, 0 lost, 0 hangs detected (no false positive)",
        passed=True,
    )
    wait_until(lambda: all(w["ready"] for w in workers(url)), 120)
    hangs_before = sum(int(w["hangs"]) for w in workers(url))
    phase_s = run.seconds(15)
    before = StreamLoad(url, LoadSpec(streams=run.streams)).start()
    time.sleep(phase_s)
    calm = before.stop()
    with cpu_hogs(num_hogs):
        hogged = StreamLoad(url, LoadSpec(streams=run.streams)).start()
        time.sleep(phase_s)
        slowed = hogged.stop()
    result.count(tally(calm + slowed))
    hangs = sum(int(w["hangs"]) for w in workers(url)) - hangs_before
    (calm_rate, calm_p50), (slow_rate, slow_p50) = map(_rate_and_latency, (calm, slowed))
    result.notes.append(
        f"{calm_rate:.2f} req/s (p50 {calm_p50:.2f} s) before, {slow_rate:.2f} req/s "
        f"(p50 {slow_p50:.2f} s) with the hogs; {hangs} hangs detected"
    )
    result.check(result.failed == 0 and result.lost == 0, "0 failed and 0 lost")
    result.check(hangs == 0, "no hang detected")
    return result


def run_worker_faults(run: ChaosRun) -> list[FaultResult]:
    """The three worker faults, one after another, on one `--workers 2` server."""
    results = []
    with serving(
        run.log_dir, "worker-faults", "--workers", str(NUM_WORKERS), num_workers=NUM_WORKERS
    ) as server:
        for fault in (worker_killed, worker_hung, worker_slowed):
            started = time.monotonic()
            result = fault(run, server.url)
            result.duration_s = time.monotonic() - started
            results.append(result)
    return results
