"""Disaggregated prefill/decode under 16 streams (`scheduler.mode: disaggregated`, one
prefill and two decode workers): a prefill worker killed (-9) loses no request (its
prompts run on a decode worker), a decode worker killed fails only the streams it held
(cleanly), either way the replacement joins its pool and no ticket file is left."""

from __future__ import annotations

import glob
import os
import time
from typing import Any

from tests.chaos.context import ChaosRun
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving, wait_until, workers
from tests.chaos.worker_faults import REPLACE_TARGET_S, kill_under_load

PREFILL, DECODE = 1, 2
ENV = {
    "INFERFLUX_SCHEDULER__MODE": "disaggregated",
    "INFERFLUX_SCHEDULER__PREFILL_POOL_SIZE": str(PREFILL),
    "INFERFLUX_SCHEDULER__DECODE_POOL_SIZE": str(DECODE),
}


def _of(url: str, role: str) -> list[dict[str, Any]]:
    return [w for w in workers(url) if w.get("role") == role]


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
    victim = kill_under_load(
        run, url, result, lambda: max(_of(url, role), key=lambda w: int(w["num_in_flight"]))
    )
    allowed = 0 if prefill else max(int(victim["num_in_flight"]), 1)
    result.check(result.failed <= allowed, "failed ≤ allowed")
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
