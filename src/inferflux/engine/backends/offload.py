"""The backend-selection seam: which backend a worker's model load asks for and gets.

Owns the pure decision, per model load, of the requested backend (`cuda`, `metal`,
`vulkan`, ... or `cpu` when `runtime.n_gpu_layers` is 0), the effective one, and why they
differ (`fallback_reason`): the build cannot offload, no GPU device is present, the load
with GPU layers failed (it is retried with none), or the API process restarted the worker
on CPU after it died repeatedly on the GPU (`CrashHistory`). It also owns the GPU fault
injection of tests and chaos runs (`runtime.fault_gpu_init`, env
`INFERFLUX_FAULT_GPU_INIT`; inert when `off`). Does not own: asking llama.cpp what it can
do (`gpu_support` in llama_cpp.py) nor loading (the caller passes a loader).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

from inferflux.errors import ModelLoadError

logger = logging.getLogger(__name__)

GpuFault = Literal["off", "fail", "crash"]
CPU = "cpu"
GPU = "gpu"  # the requested backend when the build names no GPU backend
# Deaths with GPU layers that count towards `runtime.gpu_fallback_after_crashes` are those
# within this window; older ones are forgotten (a worker that crashes once a day stays).
CRASH_WINDOW_S = 300.0

_Loaded = TypeVar("_Loaded")


@dataclass(frozen=True, slots=True)
class GpuSupport:
    """What the llama.cpp build and the host offer for offloading."""

    can_offload: bool  # llama_supports_gpu_offload()
    backend: str = ""  # the GPU backend's name, lower case ("cuda"); "" when none
    num_devices: int = 0  # GPU devices llama.cpp sees
    error: str | None = None  # why the GPU backend could not be initialised


@dataclass(frozen=True, slots=True)
class OffloadPlan:
    """One model load's backend: what was asked for, what runs, and why they differ."""

    requested: str  # "cpu", or the GPU backend asked for ("cuda", or "gpu" if unnamed)
    backend: str  # the backend the model runs on
    n_gpu_layers: int  # what llama.cpp is given
    fallback_reason: str | None = None  # None: runs where requested
    crash: bool = False  # fault injection: the worker is to crash before loading

    @property
    def fell_back(self) -> bool:
        return self.fallback_reason is not None


def plan_offload(
    n_gpu_layers: int,
    support: GpuSupport,
    *,
    fallback: bool,
    forced_cpu_reason: str | None = None,
) -> OffloadPlan:
    """The backend of a load asking for `n_gpu_layers` on a build/host with `support`.

    With `fallback` a GPU that cannot be used gives a CPU load (n_gpu_layers 0) and the
    reason; without it `n_gpu_layers` goes to llama.cpp unchanged (the behaviour before
    the fallback: a build without offload runs on CPU anyway), except that a GPU backend
    that failed to initialise refuses the load. `forced_cpu_reason` (the API process
    restarted this worker on CPU) always wins.
    """
    if n_gpu_layers == 0:
        return OffloadPlan(requested=CPU, backend=CPU, n_gpu_layers=0)
    requested = support.backend or GPU
    if forced_cpu_reason is not None:
        return OffloadPlan(requested, CPU, 0, forced_cpu_reason)
    reason = _unusable(support)
    if reason is None:
        return OffloadPlan(requested, requested, n_gpu_layers)
    if fallback:
        return OffloadPlan(requested, CPU, 0, reason)
    if support.error is not None:
        raise ModelLoadError(f"{reason}; set runtime.gpu_fallback true to serve on CPU instead")
    return OffloadPlan(requested, CPU, n_gpu_layers, reason)


def _unusable(support: GpuSupport) -> str | None:
    """Why the GPU cannot be used, or None when it can."""
    if support.error is not None:
        return f"the GPU backend failed to initialise: {support.error}"
    if not support.can_offload:
        return "this llama.cpp build cannot offload to a GPU (llama_supports_gpu_offload is false)"
    if support.num_devices == 0:
        return "no GPU device found"
    return None


def apply_fault(support: GpuSupport, fault: GpuFault) -> GpuSupport:
    """`support` as the fault injection makes it look: `fail` = the GPU backend failed to
    initialise (whatever the hardware; the backend keeps its real name, "" on a CPU
    build); `off` and `crash` leave it as it is."""
    if fault != "fail":
        return support
    return replace(
        support,
        can_offload=False,
        error="fault injected (runtime.fault_gpu_init / INFERFLUX_FAULT_GPU_INIT=fail)",
    )


def choose_backend(
    n_gpu_layers: int,
    probe: Callable[[], GpuSupport],
    *,
    fallback: bool,
    fault: GpuFault = "off",
    forced_cpu_reason: str | None = None,
) -> OffloadPlan:
    """The seam: `plan_offload` over what `probe` says (llama.cpp is asked only when GPU
    layers are requested), as the fault injection makes it look. With the `crash` fault a
    worker asked for GPU layers, and not restarted on CPU, is to crash before loading (as
    the CUDA start-up crash did)."""
    if n_gpu_layers == 0:
        return OffloadPlan(requested=CPU, backend=CPU, n_gpu_layers=0)
    support = apply_fault(probe(), fault)
    plan = plan_offload(
        n_gpu_layers, support, fallback=fallback, forced_cpu_reason=forced_cpu_reason
    )
    if fault == "crash" and forced_cpu_reason is None:
        return replace(plan, crash=True)
    return plan


def load_with_fallback(
    plan: OffloadPlan, load: Callable[[int], _Loaded], *, fallback: bool
) -> tuple[_Loaded, OffloadPlan]:
    """`load(plan.n_gpu_layers)`; when that raises ModelLoadError with GPU layers and
    `fallback` is on, one WARNING and `load(0)`: the model is then served on CPU."""
    try:
        return load(plan.n_gpu_layers), plan
    except ModelLoadError as exc:
        if plan.n_gpu_layers == 0 or not fallback:
            raise
        reason = f"loading with {plan.n_gpu_layers} GPU layers failed: {exc.message}"
    logger.warning("GPU → CPU fallback (%s requested): %s; loading on CPU", plan.requested, reason)
    return load(0), OffloadPlan(plan.requested, CPU, 0, reason)


def log_plan(plan: OffloadPlan, worker_id: int) -> None:
    """The WARNING of a fallback decided before loading (nothing when there is none)."""
    if plan.fell_back and plan.n_gpu_layers == 0:
        logger.warning(
            "GPU → CPU fallback: worker %d serves on CPU (%s requested): %s",
            worker_id,
            plan.requested,
            plan.fallback_reason,
        )


@dataclass(slots=True)
class CrashHistory:
    """Deaths of one worker slot while it ran with GPU layers (API process side)."""

    died_at: list[float] = field(default_factory=list)  # time.monotonic() stamps

    def record(self, now: float, *, after: int, window_s: float = CRASH_WINDOW_S) -> bool:
        """Note a death at `now`; True once `after` of them fell within `window_s`."""
        self.died_at = [t for t in self.died_at if now - t <= window_s] + [now]
        return len(self.died_at) >= after

    def reason(self, exitcode: int | None) -> str:
        return (
            f"restarted on CPU after the worker died {len(self.died_at)} times within "
            f"{CRASH_WINDOW_S:g} s with GPU layers (last exit code {exitcode})"
        )
