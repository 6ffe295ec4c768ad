"""The backend-selection seam (engine/backends/offload.py): which backend a load asks for
and gets, the GPU → CPU fallback of a failed GPU load, the fault injection, and the crash
count after which the API process restarts a worker on CPU. Pure logic; the real loads
are tests/integration/test_gpu_fallback.py's."""

from __future__ import annotations

import logging

import pytest

from inferflux.engine.backends.offload import (
    CRASH_WINDOW_S,
    CrashHistory,
    GpuSupport,
    OffloadPlan,
    apply_fault,
    choose_backend,
    load_with_fallback,
    plan_offload,
)
from inferflux.errors import ModelLoadError

CUDA = GpuSupport(can_offload=True, backend="cuda", num_devices=1)
CPU_BUILD = GpuSupport(can_offload=False)
NO_DEVICE = GpuSupport(can_offload=True, backend="", num_devices=0)


def test_zero_gpu_layers_is_cpu_without_asking_llama_cpp() -> None:
    def probe() -> GpuSupport:
        raise AssertionError("not asked")

    plan = choose_backend(0, probe, fallback=True, fault="fail")
    assert plan == OffloadPlan(requested="cpu", backend="cpu", n_gpu_layers=0)


def test_a_usable_gpu_serves_where_asked() -> None:
    plan = plan_offload(-1, CUDA, fallback=True)
    assert (plan.requested, plan.backend, plan.n_gpu_layers, plan.fallback_reason) == (
        "cuda",
        "cuda",
        -1,
        None,
    )


@pytest.mark.parametrize(
    ("support", "reason"),
    [(CPU_BUILD, "cannot offload"), (NO_DEVICE, "no GPU device")],
)
def test_an_unusable_gpu_falls_back_to_cpu_with_the_reason(support, reason) -> None:
    plan = plan_offload(-1, support, fallback=True)
    assert (plan.requested, plan.backend, plan.n_gpu_layers) == ("gpu", "cpu", 0)
    assert plan.fallback_reason is not None and reason in plan.fallback_reason


def test_without_fallback_the_layers_go_to_llama_cpp_unchanged() -> None:
    plan = plan_offload(-1, CPU_BUILD, fallback=False)
    assert plan.n_gpu_layers == -1 and plan.backend == "cpu"


def test_without_fallback_a_failed_gpu_init_refuses_the_load() -> None:
    with pytest.raises(ModelLoadError, match="gpu_fallback"):
        choose_backend(-1, lambda: CUDA, fallback=False, fault="fail")


def test_the_fail_fault_makes_a_working_gpu_look_failed() -> None:
    support = apply_fault(CUDA, "fail")
    assert not support.can_offload and support.backend == "cuda"
    assert support.error is not None and "INFERFLUX_FAULT_GPU_INIT" in support.error
    assert apply_fault(CUDA, "off") is CUDA
    plan = choose_backend(-1, lambda: CUDA, fallback=True, fault="fail")
    assert (plan.requested, plan.backend, plan.n_gpu_layers) == ("cuda", "cpu", 0)
    assert plan.fallback_reason is not None and "failed to initialise" in plan.fallback_reason
    on_a_cpu_build = choose_backend(-1, lambda: CPU_BUILD, fallback=True, fault="fail")
    assert (on_a_cpu_build.requested, on_a_cpu_build.backend) == ("gpu", "cpu")


def test_the_crash_fault_crashes_gpu_workers_until_restarted_on_cpu() -> None:
    assert choose_backend(-1, lambda: CUDA, fallback=True, fault="crash").crash
    assert not choose_backend(0, lambda: CUDA, fallback=True, fault="crash").crash
    forced = choose_backend(
        -1, lambda: CUDA, fallback=True, fault="crash", forced_cpu_reason="restarted on CPU"
    )
    assert not forced.crash
    assert (forced.requested, forced.backend, forced.n_gpu_layers) == ("cuda", "cpu", 0)
    assert forced.fallback_reason == "restarted on CPU"


def test_a_failed_gpu_load_is_retried_on_cpu_with_one_warning(caplog) -> None:
    calls: list[int] = []

    def load(n_gpu_layers: int) -> str:
        calls.append(n_gpu_layers)
        if n_gpu_layers:
            raise ModelLoadError("llama.cpp could not load m.gguf")
        return "model"

    with caplog.at_level(logging.WARNING, logger="inferflux.engine.backends.offload"):
        model, plan = load_with_fallback(plan_offload(-1, CUDA, fallback=True), load, fallback=True)
    assert model == "model" and calls == [-1, 0]
    assert (plan.requested, plan.backend, plan.n_gpu_layers) == ("cuda", "cpu", 0)
    assert plan.fallback_reason is not None and "could not load" in plan.fallback_reason
    assert len(caplog.records) == 1 and "GPU → CPU fallback" in caplog.records[0].getMessage()


@pytest.mark.parametrize(("fallback", "layers"), [(False, -1), (True, 0)])
def test_a_failed_load_is_not_retried_without_fallback_or_gpu(fallback, layers) -> None:
    calls: list[int] = []

    def load(n_gpu_layers: int) -> str:
        calls.append(n_gpu_layers)
        raise ModelLoadError("no")

    plan = OffloadPlan("cuda", "cuda", layers) if layers else OffloadPlan("cpu", "cpu", 0)
    with pytest.raises(ModelLoadError):
        load_with_fallback(plan, load, fallback=fallback)
    assert calls == [layers]


def test_crashes_count_within_the_window_only() -> None:
    history = CrashHistory()
    assert not history.record(0.0, after=3)
    assert not history.record(1.0, after=3)
    assert not history.record(CRASH_WINDOW_S + 0.5, after=3)  # the first one is forgotten
    assert history.record(CRASH_WINDOW_S + 1.0, after=3)
    assert "3 times" in history.reason(-11) and "exit code -11" in history.reason(-11)
