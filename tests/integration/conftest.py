"""The real server for integration tests: a subprocess on a free port, or the app in-process.

`server_url`: `inferflux serve --port <free port>` with the default model (SmolLM2-135M),
started once per session and ready (GET /readyz → 200) before any test uses it.
`inprocess_app`: `create_app` over the real engine on a thread (`runtime.in_process`),
lifespan started; `api_client` drives it with httpx's ASGITransport.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from inferflux.api import create_app
from inferflux.config.loader import load_settings
from inferflux.engine import load_served_model, make_engine_client

SERVER_START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("INFERFLUX_")}


def _wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"inferflux serve exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"inferflux serve not ready after {SERVER_START_TIMEOUT_S} s:\n{_tail(log_path)}")


def _tail(path: Path, num_chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-num_chars:]


@pytest.fixture(scope="session")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the `server_url` subprocess writes its stdout and stderr."""
    return tmp_path_factory.mktemp("server") / "inferflux.log"


@pytest.fixture(scope="session")
def server_url(server_log: Path) -> Iterator[str]:
    """Base URL of a real `inferflux serve` subprocess (default model, one worker)."""
    port = free_port()
    log_path = server_log
    command = [str(Path(sys.executable).parent / "inferflux"), "serve", "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_clean_env())
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="session")
async def inprocess_app() -> AsyncIterator[FastAPI]:
    """The app over the real engine on a thread of this process, lifespan running."""
    settings = load_settings(env={}, overrides={"runtime.in_process": True})
    model_info, tokenizer = load_served_model(settings)
    engine = make_engine_client(settings, model_info)
    app = create_app(settings, engine=engine, tokenizer=tokenizer, model_info=model_info)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def api_client(inprocess_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=inprocess_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inferflux") as client:
        yield client
