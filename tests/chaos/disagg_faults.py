"""Disaggregated prefill/decode under 16 streams (`scheduler.mode: disaggregated`, one
prefill and two decode workers): a prefill worker killed (-9) loses no request (its
prompts run on a decode worker), a decode worker killed fails only the streams it held
(cleanly), either way the replacement joins its pool and no ticket file is left."""

from __future__ import annotations

import glob
import os
import signal
import time
from typing import Any

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, StreamLoad, first_ok_after, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving, wait_until, workers

PREFILL, DECODE = 1, 2
REPLACE_TARGET_S = 60.0
ENV = {
    "INFERFLUX_SCHEDULER__MODE": "disaggregated",
    "INFERFLUX_SCHEDULER__PREFILL_POOL_SIZE": str(PREFILL),
    "INFERFLUX_SCHEDULER__DECODE_POOL_SIZE": str(DECODE),
}


def _of(url: str, role: str) -> list[dict[str, Any]]:
    return [w for w in workers(url) if w.get("role") == role]


def _replaced(url: str, victim: dict[str, Any]) -> bool:
    worker = next(w for w in workers(url) if w["worker_id"] == victim["worker_id"])
    return bool(worker["ready"]) and worker["pid"] != victim["pid"]


def _tickets_left(server_pid: int) -> int:
    folders = glob.glob(f"/dev/shm/inferflux-kv-{server_pid}-*")
    return sum(1 for folder in folders for name in os.listdir(folder) if name.startswith("t"))


def _killed(run: ChaosRun, url: str, server_pid: int, role: str) -> FaultResult:
    prefill = role == "prefill"
    result = FaultResult(
        f"{role} worker kill -9 ({run.streams} streams, {PREFILL}P + {DECODE}D)",
        target=(
            "0 failed, 0 lost, 0 500s (prompts run on a decode worker)"
            if prefill
            else "0 lost, 0 500s; failed ≤ streams on the victim"
        )
        + f"; replaced ≤ {REPLACE_TARGET_S:.0f} s; no ticket left",
        passed=True,
    )
    wait_until(lambda: all(w["ready"] for w in workers(url)), 120)
    load = StreamLoad(url, LoadSpec(streams=run.streams)).start()
    load.wait_for(run.streams)
    victim = max(_of(url, role), key=lambda w: int(w["num_in_flight"]))
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    result.recovery_s = wait_until(lambda: _replaced(url, victim), 120)
    time.sleep(run.seconds(9))
    outcomes = load.stop()
    result.count(tally(outcomes))
    again = first_ok_after(outcomes, killed_at)
    result.notes.append(
        f"victim held {victim['num_in_flight']} requests; first ok request sent after the kill "
        f"ended {again if again is None else round(again, 2)} s after it"
    )
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    allowed = 0 if prefill else max(int(victim["num_in_flight"]), 1)
    result.check(result.failed <= allowed, "failed ≤ allowed")
    result.check(
        result.recovery_s is not None and result.recovery_s <= REPLACE_TARGET_S, "replaced"
    )
    drained = wait_until(lambda: _tickets_left(server_pid) == 0, 30)
    result.check(drained is not None, "no ticket file left")
    return result


def disagg_faults(run: ChaosRun) -> list[FaultResult]:
    """A prefill worker, then a decode worker, killed under load, on one server."""
    results = []
    with serving(run.log_dir, "disagg-faults", env=ENV, num_workers=PREFILL + DECODE) as server:
        for role in ("prefill", "decode"):
            started = time.monotonic()
            result = _killed(run, server.url, server.process.pid, role)
            result.duration_s = time.monotonic() - started
            results.append(result)
    return results
