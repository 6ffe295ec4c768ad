"""`FakeModelLoader`: a `ModelLoader` whose models are `FakeEngineClient`s, for unit tests of the
model manager's pure logic (routing, LRU, swap, drain). It verifies and loads nothing real."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from inferflux.api.observed_engine import ObservedEngine
from inferflux.api.telemetry import Telemetry, make_telemetry
from inferflux.config.settings import Settings
from inferflux.engine.protocol import EngineClient, ModelInfo
from inferflux.errors import ModelLoadError
from inferflux.models.resident import ResidentModel, build_serving
from inferflux.models.serving import ClientEngine, ServedEngine
from inferflux.models.spec import ModelSpec
from tests.fakes.engine import FakeEngineClient, FakeTokenizer, fake_model_info


class FakeModelLoader:
    """Builds a slot per spec. `fail[path name]` raises that error; `gate` (when set)
    holds every load until it is set; `loads` lists the ids loaded, in order."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.telemetry: Telemetry = make_telemetry(settings, lambda: [], fake_model_info())
        self.fail: dict[str, ModelLoadError] = {}
        self.gate: asyncio.Event | None = None
        self.loads: list[str] = []
        self.engines: dict[str, FakeEngineClient] = {}  # by path name

    def _observe(self, engine: EngineClient, tokenizer: object, info: ModelInfo) -> ServedEngine:
        return ObservedEngine(ClientEngine(engine), self.telemetry, info.model_id)

    def slot(self, spec: ModelSpec) -> ResidentModel:
        info = dataclasses.replace(
            fake_model_info(),
            model_id=spec.model_id,
            path=str(spec.path),
            aliases=spec.aliases,
            adapters=spec.adapters,
            base_model_id=spec.base_id or "",
        )
        # keyed by the file that makes the model: its adapter's, else its own
        name = Path(spec.adapters[-1].path).name if spec.adapters else spec.path.name
        engine = FakeEngineClient(pieces=[name])
        self.engines[name] = engine
        serving = build_serving(self.settings, engine, FakeTokenizer(), info, self._observe)
        return ResidentModel(spec, serving, load_s=0.01)

    async def load(self, spec: ModelSpec) -> ResidentModel:
        if self.gate is not None:
            await self.gate.wait()
        name = Path(spec.adapters[-1].path).name if spec.adapters else spec.path.name
        error = self.fail.get(name)
        if error is not None:
            raise error
        self.loads.append(spec.model_id)
        slot = self.slot(spec)
        await slot.serving.engine.start()
        return slot
