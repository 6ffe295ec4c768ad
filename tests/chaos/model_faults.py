"""The model file under the server's feet: a GGUF truncated before the server loads it
(a clean exit 1 naming the file, no hang), a new file renamed over the loaded one (the
server keeps serving the file it mapped), and the loaded file truncated in place (the
workers' mapped weights vanish: they crash, the requests they held fail cleanly, and
restarts are refused with a clear error while the file stays broken)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx

from inferflux.models.files import default_model_path
from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, StreamLoad, tally
from tests.chaos.report import FaultResult, run_faults
from tests.chaos.servers import serving, wait_until
from tests.integration.server_process import ServerProcess

EXIT_TARGET_S = 60.0


def _copy(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    shutil.copyfile(default_model_path(), target)
    return target


def truncated_before_load(run: ChaosRun) -> FaultResult:
    result = FaultResult(
        "GGUF truncated (half its bytes) before the server loads it",
        target=f"exit status 1 naming the file ≤ {EXIT_TARGET_S:.0f} s; no hang, no traceback",
        passed=True,
    )
    path = _copy(run.log_dir / "models", "truncated.gguf")
    os.truncate(path, path.stat().st_size // 2)
    log_path = run.log_dir / "model-truncated.log"
    server = ServerProcess("--model", str(path), log_path=log_path)
    started = time.monotonic()
    try:
        code = server.process.wait(timeout=EXIT_TARGET_S)
    except subprocess.TimeoutExpired:
        code = None
    took_s = time.monotonic() - started
    server.kill() if code is None else server.close()
    log = log_path.read_text(errors="replace")
    last = [line for line in log.splitlines() if "inferflux:" in line][-1:]
    result.notes.append(f"exit status {code} after {took_s:.1f} s: {last}")
    result.recovery_s = took_s
    result.check(code == 1, "exit status 1")
    result.check(str(path) in log and "Traceback" not in log, "a clear message, no traceback")
    return result


def _serving_under_load(run: ChaosRun, url: str) -> StreamLoad:
    load = StreamLoad(url, LoadSpec(streams=run.streams, max_tokens=16)).start()
    load.wait_for(run.streams)
    return load


def replaced_while_loaded(run: ChaosRun) -> FaultResult:
    result = FaultResult(
        "GGUF replaced (a new file renamed over it) while loaded (16 streams)",
        target="0 failed, 0 lost: the workers keep the file they mapped",
        passed=True,
    )
    path = _copy(run.log_dir / "models", "replaced.gguf")
    with serving(run.log_dir, "model-replaced", "--model", str(path)) as server:
        load = _serving_under_load(run, server.url)
        fresh = _copy(run.log_dir / "models", "fresh.gguf")
        os.truncate(fresh, fresh.stat().st_size // 3)  # a different (broken) file
        os.replace(fresh, path)
        time.sleep(run.seconds(10))
        result.count(tally(load.stop()))
    result.check(result.failed == 0 and result.lost == 0, "0 failed and 0 lost")
    return result


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def truncated_while_loaded(run: ChaosRun) -> FaultResult:
    result = FaultResult(
        "GGUF truncated in place while loaded (16 streams)",
        target="0 lost, 0 500s (requests fail cleanly); /readyz 503 or a clean exit while "
        "the file is broken",
        passed=True,
    )
    path = _copy(run.log_dir / "models", "inplace.gguf")
    with serving(run.log_dir, "model-inplace", "--model", str(path)) as server:
        load = _serving_under_load(run, server.url)
        os.truncate(path, path.stat().st_size // 2)
        broken_at = time.monotonic()
        unready_s = wait_until(lambda: not _ready(server.url), 60)
        time.sleep(run.seconds(6))
        outcomes = load.stop()
        exited = server.process.poll()
        result.recovery_s = None
        result.notes.append(
            f"/readyz not 200 after {unready_s if unready_s is None else round(unready_s, 1)} s; "
            f"server exit status {exited} ({time.monotonic() - broken_at:.0f} s after)"
        )
    result.count(tally(outcomes))
    log = (run.log_dir / "model-inplace.log").read_text(errors="replace")
    signals = sorted(
        {line.split("exit code")[1][:5] for line in log.splitlines() if "exit code" in line}
    )
    result.notes.append(f"worker exit codes seen: {signals}")
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    result.check(unready_s is not None, "unready while the file is broken")
    return result


def model_faults(run: ChaosRun) -> list[FaultResult]:
    return run_faults(run, (truncated_before_load, replaced_while_loaded, truncated_while_loaded))
