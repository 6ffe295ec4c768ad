"""GPU → CPU fallback over a real `inferflux serve` asking for every layer on the GPU
(`INFERFLUX_RUNTIME__N_GPU_LAYERS=-1`) while the GPU is faulted at the backend-selection
seam (`INFERFLUX_FAULT_GPU_INIT`, engine/backends/offload.py; docs/reliability.md):

- `fail`: the GPU backend looks as if it failed to initialise; the worker loads on CPU;
- `crash`: a worker with GPU layers dies at start (SIGSEGV, as the CUDA start-up crash
  did); after `runtime.gpu_fallback_after_crashes` deaths it is restarted on CPU.

Either way generation works, /server/stats says backend cpu with the reason,
`inferflux_worker_backend_info` says backend cpu / requested gpu, and the log has the
WARNING. On this CPU build the requested backend is named `gpu` (the build names none).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from inferflux.cli.inferctl import app
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

MODES = {
    "fail": ("failed to initialise", {}),
    "crash": ("restarted on CPU after the worker died 2 times", {
        "INFERFLUX_RUNTIME__GPU_FALLBACK_AFTER_CRASHES": "2",
    }),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(MODES))
def faulted(request, tmp_path_factory) -> Iterator[tuple[str, ServerProcess, Path]]:
    mode = request.param
    log_path = tmp_path_factory.mktemp(f"gpu-{mode}") / "server.log"
    env = {
        "INFERFLUX_RUNTIME__N_GPU_LAYERS": "-1",
        "INFERFLUX_FAULT_GPU_INIT": mode,
        "INFERFLUX_MODEL__CTX_SIZE": "512",
        **MODES[mode][1],
    }
    server = ServerProcess(env=env, log_path=log_path)
    try:
        try:
            server.wait_ready(120)
        except (RuntimeError, TimeoutError) as exc:
            pytest.fail(f"{exc}:\n{log_path.read_text(errors='replace')[-4000:]}")
        yield mode, server, log_path
    finally:
        server.close()


def test_the_model_is_served_on_cpu_and_reported(faulted) -> None:
    mode, server, log_path = faulted
    model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8}
    body["temperature"] = 0
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"]

    (worker,) = httpx.get(f"{server.url}/server/stats", timeout=10).json()["workers"]
    assert (worker["backend"], worker["requested_backend"]) == ("cpu", "gpu")
    assert MODES[mode][0] in worker["fallback_reason"]
    assert worker["restarts"] == (2 if mode == "crash" else 0)

    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    sample = 'inferflux_worker_backend_info{backend="cpu",requested="gpu",worker="0"} 1.0'
    assert sample in metrics

    status = CliRunner().invoke(app, ["status", "--url", server.url])
    assert "backend cpu (requested gpu: " in status.output, status.output

    (running,) = httpx.get(f"{server.url}/api/ps", timeout=10).json()["models"]
    assert running["size_vram"] == 0  # Ollama's view: nothing offloaded

    lines = [json.loads(line) for line in log_path.read_text().splitlines() if "GPU → CPU" in line]
    assert lines and all(line["level"] == "warning" for line in lines), lines


def test_a_cpu_server_reports_cpu_without_a_reason(server_url: str) -> None:
    (worker,) = httpx.get(f"{server_url}/server/stats", timeout=10).json()["workers"]
    assert (worker["backend"], worker["requested_backend"]) == ("cpu", "cpu")
    assert worker["fallback_reason"] is None
    metrics = httpx.get(f"{server_url}/metrics", timeout=10).text
    assert 'inferflux_worker_backend_info{backend="cpu",requested="cpu",worker="0"} 1.0' in metrics


def test_without_fallback_a_failed_gpu_init_stops_the_server(tmp_path: Path) -> None:
    """`runtime.gpu_fallback: false` keeps the behaviour before the fallback: the worker's
    load fails and the server exits 1 with a message that names the setting."""
    env = {
        "INFERFLUX_RUNTIME__N_GPU_LAYERS": "-1",
        "INFERFLUX_RUNTIME__GPU_FALLBACK": "false",
        "INFERFLUX_FAULT_GPU_INIT": "fail",
    }
    server = ServerProcess(env=env, log_path=tmp_path / "server.log")
    try:
        code = server.process.wait(timeout=120)
    finally:
        server.close()
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert code == 1, log[-2000:]
    assert "failed to initialise" in log and "runtime.gpu_fallback" in log
    assert "Traceback" not in log


def test_the_probe_reads_this_build() -> None:
    """The seam's probe through the real llama.cpp: this CPU build cannot offload and
    registers no GPU device (on a CUDA build: can_offload, backend "cuda")."""
    from inferflux.engine.backends.llama_cpp import gpu_support

    support = gpu_support()
    assert (support.can_offload, support.backend, support.num_devices) == (False, "", 0)
