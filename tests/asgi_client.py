"""An httpx client over ASGI to an app whose lifespan runs (unit tests of the API)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI


@asynccontextmanager
async def running_client(app: FastAPI, **client_args: Any) -> AsyncIterator[httpx.AsyncClient]:
    """`app` started (its lifespan) and a client to it; both stop when the block exits."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", **client_args
        ) as client:
            yield client
