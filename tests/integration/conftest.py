"""The real server for integration tests: a subprocess on a free port, or the app in-process.

`server_url`: `inferflux serve --port <free port>` with the default model (SmolLM2-135M),
started once per session and ready (GET /readyz → 200) before any test uses it.
`inprocess_app`: `create_app` over the real engine on a thread (`runtime.in_process`),
lifespan started; `api_client` drives it with httpx's ASGITransport.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from inferflux.api import create_app
from inferflux.config.loader import load_settings
from inferflux.engine import load_served_model, make_engine_client
from tests.integration.server_process import ServerProcess

SERVER_START_TIMEOUT_S = 180.0


@pytest.fixture(scope="session")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the `server_url` subprocess writes its stdout and stderr."""
    return tmp_path_factory.mktemp("server") / "inferflux.log"


@pytest.fixture(scope="session")
def server_url(server_log: Path) -> Iterator[str]:
    """Base URL of a real `inferflux serve` subprocess (default model, one worker)."""
    server = ServerProcess(log_path=server_log)
    try:
        server.wait_ready(SERVER_START_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as exc:
        server.close()
        pytest.fail(f"{exc}:\n{server_log.read_text(errors='replace')[-4000:]}")
    yield server.url
    server.close()


@pytest.fixture(scope="session")
async def inprocess_app() -> AsyncIterator[FastAPI]:
    """The app over the real engine on a thread of this process, lifespan running."""
    settings = load_settings(env={}, overrides={"runtime.in_process": True})
    model_info, tokenizer = load_served_model(settings)
    engine = make_engine_client(settings, model_info)
    app = create_app(settings, engine=engine, tokenizer=tokenizer, model_info=model_info)
    async with app.router.lifespan_context(app):
        # the lifespan starts the engine in the background; wait for a ready worker
        for _ in range(1200):
            if engine.ready:
                break
            await asyncio.sleep(0.1)
        assert engine.ready, "the in-process engine did not become ready"
        yield app


@pytest.fixture
async def api_client(inprocess_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=inprocess_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inferflux") as client:
        yield client
