"""Start a server for a benchmark and wait until it answers: `inferflux serve`, or any
command (`start_process`, used by bench/compare for llama-server and llama-cpp-python)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

INFERFLUX = str(Path(sys.executable).with_name("inferflux"))


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
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    proc.wait()
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
