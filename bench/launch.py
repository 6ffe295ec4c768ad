"""Start `inferflux serve` for a benchmark and wait until /readyz answers 200."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

INFERFLUX = str(Path(sys.executable).with_name("inferflux"))


def start_server(
    port: int, args: list[str] | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A server on 127.0.0.1:`port` with extra CLI `args` and `env`; exits if not ready."""
    proc = subprocess.Popen(
        [INFERFLUX, "serve", "--port", str(port), *(args or [])],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("the server did not become ready")
