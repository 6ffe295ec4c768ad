"""An InferFlux app over the fake engine and tokenizer, driven in-process through httpx."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from inferflux.api import create_app
from inferflux.config.settings import Settings
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info


@pytest.fixture
def engine() -> FakeEngineClient:
    return FakeEngineClient()


@pytest.fixture
def tokenizer() -> FakeTokenizer:
    return FakeTokenizer()


@pytest.fixture
def settings() -> Settings:
    return Settings.model_validate({"server": {"max_request_bytes": 4096}})


@pytest.fixture
async def app(
    engine: FakeEngineClient, tokenizer: FakeTokenizer, settings: Settings
) -> AsyncIterator[FastAPI]:
    app = create_app(settings, engine=engine, tokenizer=tokenizer, model_info=fake_model_info())
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
