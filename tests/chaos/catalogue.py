"""The fault groups `python -m tests.chaos` runs, in order (each starts its own servers)."""

from __future__ import annotations

from collections.abc import Callable

from tests.chaos.client_faults import client_faults
from tests.chaos.context import ChaosRun
from tests.chaos.disagg_faults import disagg_faults
from tests.chaos.disk_faults import disk_faults
from tests.chaos.fuzz import fuzz
from tests.chaos.gpu_faults import gpu_faults
from tests.chaos.memory_faults import memory_faults
from tests.chaos.model_faults import model_faults
from tests.chaos.opa_faults import opa_faults
from tests.chaos.redis_faults import redis_restarted
from tests.chaos.report import FaultResult
from tests.chaos.soak import soak
from tests.chaos.worker_faults import run_worker_faults

GROUPS: dict[str, Callable[[ChaosRun], list[FaultResult]]] = {
    "worker": run_worker_faults,
    "disagg": disagg_faults,
    "redis": redis_restarted,
    "opa": opa_faults,
    "client": client_faults,
    "disk": disk_faults,
    "model": model_faults,
    "memory": memory_faults,
    "gpu": gpu_faults,
    "fuzz": fuzz,
    "soak": soak,
}
