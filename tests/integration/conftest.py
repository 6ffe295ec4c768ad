"""The real server for integration tests: a subprocess on a free port, or the app in-process.

`server_url`: `inferflux serve --port <free port>` with the default model (SmolLM2-135M),
started once per session and ready (GET /readyz → 200) before any test uses it.
`inprocess_app`: `create_app` over the real engine on a thread (`runtime.in_process`),
lifespan started; `api_client` drives it with httpx's ASGITransport.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from inferflux.config.loader import load_settings
from inferflux.security.settings_policy import base_policy
from tests.integration.inprocess_app import running_app
from tests.integration.security_support import ActAsMiddleware, MutablePolicySource, RedisServer
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
def served_model(server_url: str) -> str:
    """The id of the model `server_url` serves."""
    return str(httpx.get(f"{server_url}/v1/models").json()["data"][0]["id"])


@pytest.fixture(scope="session")
async def inprocess_app() -> AsyncIterator[FastAPI]:
    """The app over the real engine on a thread of this process, lifespan running."""
    settings = load_settings(env={}, overrides={"runtime.in_process": True})
    async with running_app(settings) as app:
        yield app


@pytest.fixture
async def api_client(inprocess_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=inprocess_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://inferflux") as client:
        yield client


@dataclass
class SecurityApp:
    """The app over the real engine with the security layer under a policy the test sets
    (`source.set(...)`); requests act as `x-test-principal: key@tenant`."""

    app: FastAPI
    asgi: object
    source: MutablePolicySource
    audit_path: Path

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.asgi)  # type: ignore[arg-type]
        return httpx.AsyncClient(transport=transport, base_url="http://inferflux", timeout=120)

    def audit_events(self) -> list[dict]:
        text = self.audit_path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line]


@pytest.fixture(scope="session")
async def security_app(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecurityApp]:
    audit_path = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    settings = load_settings(
        env={},
        overrides={
            "runtime.in_process": True,
            "audit.path": str(audit_path),
            "audit.log_raw_text": True,  # lets tests see what was queued (redaction)
        },
    )
    source = MutablePolicySource(base_policy(settings))
    async with running_app(settings, policy_source=source) as app:
        yield SecurityApp(app, ActAsMiddleware(app), source, audit_path)


@pytest.fixture
def secured(security_app: SecurityApp) -> Iterator[SecurityApp]:
    """`security_app` with its policy reset after the test."""
    yield security_app
    security_app.source.reset()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port (no persistence), for the session."""
    server = RedisServer()
    yield server
    server.kill()
