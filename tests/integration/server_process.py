"""A real `inferflux serve` subprocess on a free loopback port, for end-to-end tests.

Each server runs in its own process group (its workers too). Groups still alive when the
test process ends are killed: at a normal exit (`atexit`) and when the test process gets
SIGTERM (a CI timeout, `timeout`), which would otherwise end it without any fixture's
teardown and leave multi-GB workers behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

INFERFLUX = str(Path(sys.executable).with_name("inferflux"))


_LIVE: set[subprocess.Popen[bytes]] = set()


def _kill_live_groups() -> None:
    for process in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        _LIVE.discard(process)


def _on_sigterm(signum: int, frame: object) -> None:
    _kill_live_groups()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install() -> None:
    atexit.register(_kill_live_groups)
    with contextlib.suppress(ValueError):  # only the main thread may set handlers
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)


_install()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """Starts `inferflux serve` with `args`, waits for /readyz, and stops it on close()."""

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        executable: str = INFERFLUX,
        cwd: Path | None = None,
        port: int | None = None,
        command: str = "serve",
    ):
        """`executable`: another `inferflux` (an installed wheel's), run in `cwd`.
        `port`: a given one (a restart on the same port), else a free one. `command`:
        the subcommand (`serve`, `router`)."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [executable, command, "--port", str(self.port), *args],
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _LIVE.add(self.process)  # killed if this process ends before close()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode} before ready")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server on {self.url} not ready after {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL the whole group (a crash, not a shutdown)."""
        _LIVE.discard(self.process)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def close(self) -> None:
        _LIVE.discard(self.process)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()


@contextlib.contextmanager
def serving(env: dict[str, str], log_path: Path, timeout_s: float = 180.0) -> Iterator[str]:
    """A server with `env` for the block (its URL): a start that fails fails the test
    with the end of its log; closed afterwards."""
    server = ServerProcess(env=env, log_path=log_path)
    try:
        server.wait_ready(timeout_s)
    except (RuntimeError, TimeoutError) as exc:
        server.close()
        pytest.fail(f"{exc}:\n{log_path.read_text(errors='replace')[-3000:]}")
    try:
        yield server.url
    finally:
        server.close()


class RouterProcess(ServerProcess):
    """`inferflux router --replica URL ...` in its own process group; ready (/readyz 200)
    once at least one replica passed a health check."""

    def __init__(
        self,
        *replicas: str,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ):
        flags = [flag for url in replicas for flag in ("--replica", url)]
        super().__init__(*flags, *args, env=env, log_path=log_path, command="router")
