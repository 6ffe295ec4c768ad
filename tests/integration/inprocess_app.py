"""The app over the real engine in this process (`runtime.in_process` settings), started."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from inferflux.api import create_app
from inferflux.config.settings import Settings
from inferflux.engine import make_engine_client
from inferflux.models.files import load_served_model


@asynccontextmanager
async def running_app(settings: Settings, **app_args: Any) -> AsyncIterator[FastAPI]:
    """`create_app(settings, **app_args)` over the served model's real engine, its lifespan
    running and a worker ready (the lifespan starts the engine in the background)."""
    model_info, tokenizer = load_served_model(settings)
    engine = make_engine_client(settings, model_info)
    app = create_app(
        settings, engine=engine, tokenizer=tokenizer, model_info=model_info, **app_args
    )
    async with app.router.lifespan_context(app):
        for _ in range(1200):
            if engine.ready:
                break
            await asyncio.sleep(0.1)
        assert engine.ready, "the in-process engine did not become ready"
        yield app
