"""`ModelLoader`: a `ModelSpec` in, a ready `ResidentModel` out (or an error, and nothing left).

`EngineModelLoader` verifies the file and loads its vocabulary on a worker thread (the
event loop keeps serving the other models), starts the model's own engine workers with
the model's settings, and waits for the first one to be ready. A failure at any step
stops what was started and raises: ModelVerificationFailed, ModelLoadError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from inferflux.config.settings import Settings
from inferflux.engine.protocol import EngineClient, ModelInfo
from inferflux.models.files import load_model
from inferflux.models.resident import ResidentModel, build_serving
from inferflux.models.serving import EngineWrapper
from inferflux.models.spec import ModelSpec, model_settings

EngineFactory = Callable[[Settings, ModelInfo], EngineClient]


class ModelLoader(Protocol):
    async def load(self, spec: ModelSpec) -> ResidentModel:
        """A resident, ready model for `spec`. Raises ModelLoadError (or a subclass)."""
        ...


class EngineModelLoader:
    """Loads models into engine workers of their own."""

    def __init__(self, settings: Settings, wrap: EngineWrapper, engines: EngineFactory) -> None:
        self.settings = settings
        self.wrap = wrap
        self.engines = engines

    async def load(self, spec: ModelSpec) -> ResidentModel:
        started_at = time.monotonic()
        settings = model_settings(self.settings, spec)
        info, tokenizer = await asyncio.to_thread(load_model, spec, settings)
        try:
            engine = self.engines(settings, info)
            serving = build_serving(settings, engine, tokenizer, info, self.wrap)
            try:
                await serving.engine.start()
            except BaseException:
                await serving.engine.shutdown()
                raise
        except BaseException:
            await asyncio.to_thread(tokenizer.close)
            raise
        return ResidentModel(
            spec, serving, close=tokenizer.close, load_s=time.monotonic() - started_at
        )
