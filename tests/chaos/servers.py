"""Servers and helper processes a fault runs against, every one in a process group of its
own that is killed when the fault ends, at exit, and on SIGTERM (tests/integration/
server_process.py's `ServerProcess`; `Hog` here)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.integration.server_process import ServerProcess

START_TIMEOUT_S = 240.0


def stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/server/stats", timeout=10).json())


def metric(url: str, name: str, headers: dict[str, str] | None = None) -> float:
    """The sum of every sample of metric `name` (with `_total` for a counter) on
    /metrics; 0 when absent."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def workers(url: str) -> list[dict[str, Any]]:
    return list(stats(url)["workers"])


def all_workers_ready(url: str, count: int) -> bool:
    try:
        current = workers(url)
    except httpx.HTTPError:
        return False
    return len(current) == count and all(w["ready"] for w in current)


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `predicate` held, or None after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    return None


@contextlib.contextmanager
def serving(
    log_dir: Path,
    name: str,
    *args: str,
    env: dict[str, str] | None = None,
    num_workers: int = 1,
) -> Iterator[ServerProcess]:
    """`inferflux serve *args` (log in `log_dir/name.log`), ready with all its workers."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    server = ServerProcess(*args, env=env, log_path=log_path)
    try:
        server.wait_ready(START_TIMEOUT_S)
        if wait_until(lambda: all_workers_ready(server.url, num_workers), 120) is None:
            raise TimeoutError(f"{num_workers} workers not ready; see {log_path}")
        yield server
    finally:
        server.close()


_HOGS: set[subprocess.Popen[bytes]] = set()


def _kill_hogs() -> None:
    for hog in list(_HOGS):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hog.pid, signal.SIGKILL)
        _HOGS.discard(hog)


atexit.register(_kill_hogs)


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` busy-looping processes (one process group each) while the block runs."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]
    _HOGS.update(hogs)
    try:
        yield
    finally:
        for hog in hogs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(hog.pid, signal.SIGKILL)
            hog.wait(timeout=10)
            _HOGS.discard(hog)
