"""`Residency`: which registered models are loaded now, and the leases that hold them.

Owns: the resident models by id, leases (a request holds a resident model until its
response is sent), loading a registered model on first use (one load per model, shared
by every request that waits for it), making room under `registry.max_resident_models`
(retiring the least recently used idle model, never the default), Ollama `keep_alive`
deadlines, retirement (drain, stop the workers, free the tokenizer) and the background
tasks that run it. Does not own: names (names.py) or how a model is loaded (the `load`
callable it is given: lifecycle.py's `load_registered`).

One event loop. The lookup and the acquire of a lease never await in between, so a
request never holds a model that is already retiring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any

from inferflux.config.registry_settings import RegistrySettings
from inferflux.errors import ServiceUnavailable
from inferflux.models.resident import ResidentModel, release_freed_memory
from inferflux.models.serving import ServingState

logger = logging.getLogger(__name__)

LoadRegistered = Callable[[str], Awaitable[ResidentModel]]


class Residency:
    """The resident models. `load` makes a registered model resident (first use)."""

    def __init__(self, settings: RegistrySettings, default: ResidentModel) -> None:
        self._settings = settings
        self._resident: dict[str, ResidentModel] = {default.model_id: default}
        self._loading: dict[str, asyncio.Future[ResidentModel]] = {}
        self._retiring: set[ResidentModel] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.load: LoadRegistered | None = None  # set once by the hub

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._resident

    def __iter__(self) -> Iterator[ResidentModel]:
        return iter(list(self._resident.values()))

    def __len__(self) -> int:
        return len(self._resident)

    def get(self, model_id: str) -> ResidentModel | None:
        return self._resident.get(model_id)

    def is_loading(self, model_id: str) -> bool:
        return model_id in self._loading

    def retiring(self) -> list[ResidentModel]:
        return list(self._retiring)

    @property
    def busy(self) -> bool:
        """True while background work (retirements, preloads) runs."""
        return bool(self._tasks)

    # -- leases ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, model_id: str) -> AsyncIterator[ServingState]:
        """Hold the registered model `model_id` for one request, loading it first when
        it is not resident."""
        while True:
            resident = self._resident.get(model_id)
            if resident is None:
                resident = await self.ensure_loaded(model_id)
            if resident.try_acquire():  # NOTE: no await between the lookup and the acquire
                break
        try:
            yield resident.serving
        finally:
            resident.release()

    async def ensure_loaded(self, model_id: str) -> ResidentModel:
        """The resident model `model_id`, loading it once for every waiter."""
        future = self._loading.get(model_id)
        if future is None:
            if self.load is None:
                raise RuntimeError("Residency.load is not set")
            future = asyncio.ensure_future(self.load(model_id))
            self._loading[model_id] = future
            future.add_done_callback(lambda f: self._loaded(model_id, f))
        return await asyncio.shield(future)

    def _loaded(self, model_id: str, future: asyncio.Future[ResidentModel]) -> None:
        if self._loading.get(model_id) is future:
            del self._loading[model_id]
        if not future.cancelled():
            future.exception()  # NOTE: retrieved here even when every waiter went away

    # -- changes (the hub's lifecycle lock held) ------------------------------------------
    def put(self, resident: ResidentModel) -> ResidentModel | None:
        """Make `resident` the model its id routes to (the switch of a swap: every lease
        from now on gets it); the one it replaces, if any."""
        old = self._resident.get(resident.model_id)
        self._resident[resident.model_id] = resident
        return old

    def remove(self, model_id: str) -> ResidentModel | None:
        """Stop routing leases to `model_id`; the removed model (retire it)."""
        return self._resident.pop(model_id, None)

    async def make_room(self, default_id: str) -> None:
        """Retire least recently used idle models until one more fits."""
        while len(self._resident) >= self._settings.max_resident_models:
            idle = [r for r in self._resident.values() if not r.num_leases]
            idle = [r for r in idle if r.model_id != default_id]
            if not idle:
                raise ServiceUnavailable(
                    f"all {len(self._resident)} resident models are busy "
                    f"(registry.max_resident_models {self._settings.max_resident_models}); "
                    "retry shortly"
                )
            victim = min(idle, key=lambda r: r.last_used_at)
            logger.info("unloading idle model %s to make room", victim.model_id)
            del self._resident[victim.model_id]
            await self.retire(victim)

    async def retire(self, resident: ResidentModel) -> None:
        """Drain, stop and free `resident` (already out of routing); never raises."""
        self._retiring.add(resident)
        try:
            await resident.retire(self._settings.drain_timeout_s)
        finally:
            self._retiring.discard(resident)
        del resident
        await asyncio.to_thread(release_freed_memory)

    def retire_later(self, resident: ResidentModel) -> None:
        self.spawn(self.retire(resident), f"retire-{resident.model_id}")

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        """Run `coroutine` in the background until it ends or `shutdown`."""
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- keep_alive -----------------------------------------------------------------------
    def keep_alive(self, model_id: str, seconds: float, default_id: str) -> None:
        """Ollama `keep_alive` for a resident model (the default has no deadline)."""
        resident = self._resident.get(model_id)
        if resident is None or model_id == default_id:
            return
        resident.keep_alive_s = None if math.isinf(seconds) else seconds
        if resident.num_leases == 0:
            resident.refresh_expiry()

    def unload_expired(self, default_id: str) -> None:
        """Retire idle models whose keep_alive ran out."""
        now = time.monotonic()
        for resident in list(self._resident.values()):
            expired = resident.expires_at is not None and resident.expires_at <= now
            if expired and not resident.num_leases and resident.model_id != default_id:
                logger.info("model %s: keep_alive expired; unloading", resident.model_id)
                del self._resident[resident.model_id]
                self.retire_later(resident)

    async def shutdown(self) -> None:
        """Cancel background work and loads, then stop every model's workers."""
        residents = [*self._resident.values(), *self._retiring]  # NOTE: before retirements end
        for task in list(self._tasks):
            task.cancel()
        for future in list(self._loading.values()):
            future.cancel()
        await asyncio.gather(*self._tasks, *self._loading.values(), return_exceptions=True)
        await asyncio.gather(*(r.stop() for r in residents), return_exceptions=True)
