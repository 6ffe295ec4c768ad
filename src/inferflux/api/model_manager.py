"""`ModelManager`: the registry of models, the resident ones, and their lifecycle.

Owns: names → ids (ids, aliases, Ollama's `name:latest`), the resident `ModelSlot`s (at
most `registry.max_resident_models`; loading one more retires the least recently used
idle model, never the default), loading on first use, Ollama `keep_alive` deadlines, the
admin operations and following the manifest file. Implements `ModelLifecycle`.

Hot swap: the new model loads (verify, vocabulary, its own workers) while the old one
serves; once it is ready the id points to it, in one step of the event loop, so every
request resolved after that gets the new model and every request that holds the old one
finishes there. The old slot then drains (`ModelSlot.retire`): its workers stop, taking
their KV and prefix cache with them, and the new model's stats start from zero. A load
that fails changes nothing and raises.

Lifecycle changes (admin, manifest, first-use loads, unloading expired models) run one
at a time under `_lock`; leases never wait for it when the model is resident.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

from inferflux.api.deps import ServingState
from inferflux.api.model_loader import ModelLoader
from inferflux.api.model_router import LifecycleResult, ModelState, ModelView
from inferflux.api.model_slot import ModelSlot, release_freed_memory
from inferflux.api.registry_watch import ManifestWatcher
from inferflux.config.manifest import AdapterEntry, Manifest, ManifestEntry
from inferflux.config.registry_settings import RegistrySettings
from inferflux.engine.model_registry import RegistryPlan
from inferflux.engine.model_spec import (
    ModelSpec,
    SpecSource,
    spec_from_adapter,
    spec_from_entry,
)
from inferflux.engine.protocol import WorkerStatus
from inferflux.errors import Conflict, InferfluxError, ModelNotFound, ServiceUnavailable

logger = logging.getLogger(__name__)

_TICK_S = 0.5
_OLLAMA_TAG = ":latest"


class ModelManager:
    """Every registered model and the resident ones. One event loop."""

    def __init__(
        self,
        settings: RegistrySettings,
        plan: RegistryPlan,
        initial: ModelSlot,
        loader: ModelLoader,
        on_default: Callable[[ServingState], None],
    ) -> None:
        self._settings = settings
        self._plan = plan
        self._loader = loader
        self._on_default = on_default
        self._specs: dict[str, ModelSpec] = {}
        self._names: dict[str, str] = {}
        self._slots: dict[str, ModelSlot] = {initial.model_id: initial}
        self._loading: dict[str, asyncio.Future[ModelSlot]] = {}
        self._retiring: set[ModelSlot] = set()
        self._errors: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._default = initial.model_id
        self._init_registry(initial.spec)

    def _init_registry(self, default: ModelSpec) -> None:
        for spec in (default, *self._plan.others):
            self._register(spec)
        manifest = self._plan.manifest
        self._applied = {e.id: e for e in manifest.models} if manifest is not None else {}
        path = self._plan.manifest_path
        watch = path is not None and self._settings.poll_interval_ms > 0
        self._watcher = ManifestWatcher(path) if path is not None and watch else None

    # -- ModelRouter ----------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(
        self, name: str | None, adapter: str | None = None
    ) -> AsyncIterator[ServingState]:
        model_id = self._resolve(name)
        if adapter is not None:
            model_id = self._resolve(f"{model_id}:{adapter}")
        while True:
            slot = self._slots.get(model_id)
            if slot is None:
                slot = await self._ensure_loaded(model_id)
            if slot.try_acquire():  # NOTE: no await between the lookup and the acquire
                break
        try:
            yield slot.serving
        finally:
            slot.release()

    def access_names(self, name: str | None, adapter: str | None = None) -> tuple[str, ...]:
        model_id = self._resolve(name)
        if adapter is not None:
            model_id = self._resolve(f"{model_id}:{adapter}")
        base = self._specs[model_id].base_id
        return (model_id, base) if base else (model_id,)

    def default_serving(self) -> ServingState:
        return self._slots[self._default].serving

    def resident(self, name: str) -> ServingState | None:
        slot = self._slots.get(self._resolve(name))
        return slot.serving if slot is not None else None

    def models(self) -> list[ModelView]:
        now = time.monotonic()
        views = [self._view(spec, now) for spec in self._specs.values()]
        views += [
            ModelView(slot.model_id, slot.spec.aliases, str(slot.spec.path), slot.spec.source,
                      False, "retiring", slot.serving.model_info, slot.num_leases, slot.load_s,
                      workers=tuple(slot.serving.engine.workers()),
                      adapter_of=slot.spec.base_id, adapters=slot.spec.adapters)
            for slot in self._retiring
        ]  # fmt: skip
        failed = [i for i in self._errors if i not in self._specs]
        views += [ModelView(i, (), "", "manifest", False, "failed", error=self._errors[i],
                            registered=False) for i in failed]  # fmt: skip
        return sorted(views, key=lambda v: (not v.is_default, v.model_id, v.state))

    def _view(self, spec: ModelSpec, now: float) -> ModelView:
        slot = self._slots.get(spec.model_id)
        state: ModelState = "registered"
        if slot is not None:
            state = "loaded"
        elif spec.model_id in self._loading:
            state = "loading"
        elif spec.model_id in self._errors:
            state = "failed"
        view = ModelView(
            spec.model_id, spec.aliases, str(spec.path), spec.source,
            spec.model_id == self._default, state, error=self._errors.get(spec.model_id),
            adapter_of=spec.base_id, adapters=spec.adapters,
        )  # fmt: skip
        if slot is None:
            return view
        expires = None if slot.expires_at is None else max(0.0, slot.expires_at - now)
        return dataclasses.replace(
            view,
            info=slot.serving.model_info,
            num_in_flight=slot.num_leases,
            load_s=slot.load_s,
            idle_s=None if slot.num_leases else now - slot.last_used_at,
            expires_in_s=expires,
            workers=tuple(slot.serving.engine.workers()),
        )

    def workers(self) -> list[WorkerStatus]:
        statuses = [s for slot in self._slots.values() for s in slot.serving.engine.workers()]
        return [dataclasses.replace(s, worker_id=i) for i, s in enumerate(statuses)]

    def keep_alive(self, name: str, seconds: float) -> None:
        slot = self._slots.get(self._resolve(name))
        if slot is None or slot.model_id == self._default:
            return
        slot.keep_alive_s = None if math.isinf(seconds) else seconds
        if slot.num_leases == 0:
            slot.refresh_expiry()

    def _resolve(self, name: str | None) -> str:
        if not name:
            return self._default
        model_id = self._names.get(name)
        if model_id is None and name.endswith(_OLLAMA_TAG):
            model_id = self._names.get(name.removesuffix(_OLLAMA_TAG))
        if model_id is None:
            raise ModelNotFound(f"model '{name}' not found", param="model")
        return model_id

    # -- resident models ------------------------------------------------------------------
    async def _ensure_loaded(self, model_id: str) -> ModelSlot:
        """The resident slot of a registered model, loading it once for every waiter."""
        future = self._loading.get(model_id)
        if future is None:
            future = asyncio.ensure_future(self._load_registered(model_id))
            self._loading[model_id] = future
            future.add_done_callback(lambda f: self._loaded(model_id, f))
        return await asyncio.shield(future)

    def _loaded(self, model_id: str, future: asyncio.Future[ModelSlot]) -> None:
        if self._loading.get(model_id) is future:
            del self._loading[model_id]
        if not future.cancelled():
            future.exception()  # NOTE: retrieved here even when every waiter went away

    async def _load_registered(self, model_id: str) -> ModelSlot:
        async with self._lock:
            slot = self._slots.get(model_id)
            if slot is not None:
                return slot
            spec = self._specs.get(model_id)
            if spec is None:
                raise ModelNotFound(f"model '{model_id}' not found", param="model")
            await self._make_room()
            slot = await self._load_slot(spec)
            self._slots[model_id] = slot
            return slot

    async def _load_slot(self, spec: ModelSpec) -> ModelSlot:
        logger.info("loading model %s from %s", spec.model_id, spec.path)
        try:
            slot = await self._loader.load(spec)
        except InferfluxError as exc:
            self._errors[spec.model_id] = exc.message
            logger.error("model %s failed to load: %s", spec.model_id, exc.message)
            raise
        self._errors.pop(spec.model_id, None)
        logger.info("model %s loaded in %.2fs", spec.model_id, slot.load_s)
        return slot

    async def _make_room(self) -> None:
        """Retire least recently used idle models until one more fits (lock held)."""
        while len(self._slots) >= self._settings.max_resident_models:
            idle = [s for s in self._slots.values() if not s.num_leases]
            idle = [s for s in idle if s.model_id != self._default]
            if not idle:
                raise ServiceUnavailable(
                    f"all {len(self._slots)} resident models are busy "
                    f"(registry.max_resident_models {self._settings.max_resident_models}); "
                    "retry shortly"
                )
            victim = min(idle, key=lambda s: s.last_used_at)
            logger.info("unloading idle model %s to make room", victim.model_id)
            del self._slots[victim.model_id]
            await self._retire(victim)

    async def _retire(self, slot: ModelSlot) -> None:
        self._retiring.add(slot)
        try:
            await slot.retire(self._settings.drain_timeout_s)
        finally:
            self._retiring.discard(slot)
        del slot
        await asyncio.to_thread(release_freed_memory)

    def _retire_later(self, slot: ModelSlot) -> None:
        self._spawn(self._retire(slot), f"retire-{slot.model_id}")

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- registry -------------------------------------------------------------------------
    def _check_names(self, spec: ModelSpec) -> None:
        """Raise Conflict when one of the spec's names routes to another model."""
        for name in spec.names():
            owner = self._names.get(name)
            if owner is not None and owner != spec.model_id:
                raise Conflict(
                    f"the name {name!r} already routes to model {owner!r}", param="aliases"
                )

    def _register(self, spec: ModelSpec) -> None:
        """Add or replace `spec` (lock held). Raises Conflict when one of its names
        belongs to another model."""
        self._check_names(spec)
        self._unregister(spec.model_id)
        self._specs[spec.model_id] = spec
        self._names.update(dict.fromkeys(spec.names(), spec.model_id))

    def _unregister(self, model_id: str) -> None:
        old = self._specs.pop(model_id, None)
        for name in old.names() if old is not None else ():
            self._names.pop(name, None)

    def _make_default(self, model_id: str) -> None:
        """Point the default at a resident model (lock held)."""
        for other in (self._default, model_id):
            spec = self._specs.get(other)
            if spec is not None:
                self._specs[other] = dataclasses.replace(spec, is_default=other == model_id)
        self._default = model_id
        self._on_default(self._slots[model_id].serving)
        logger.info("model %s is the default", model_id)

    # -- ModelLifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        started_at = time.monotonic()
        await self.default_serving().engine.start()
        self._slots[self._default].load_s = time.monotonic() - started_at
        self._spawn(self._preload(), "models-preload")
        self._spawn(self._housekeeping(), "models-housekeeping")

    async def shutdown(self) -> None:
        slots = [*self._slots.values(), *self._retiring]  # NOTE: before retirements end
        for task in list(self._tasks):
            task.cancel()
        for future in list(self._loading.values()):
            future.cancel()
        await asyncio.gather(*self._tasks, *self._loading.values(), return_exceptions=True)
        await asyncio.gather(*(slot.stop() for slot in slots), return_exceptions=True)

    async def load(self, entry: ManifestEntry | str) -> LifecycleResult:
        async with self._lock:
            if isinstance(entry, str):
                spec = self._specs[self._resolve(entry)]
                return await self._load_spec(spec, make_default=False)
            spec = self._admin_spec(entry)
            return await self._load_spec(spec, make_default=entry.default)

    def _admin_spec(self, entry: ManifestEntry) -> ModelSpec:
        """The spec an admin `load` names: a new one, or the registered one when the
        entry repeats it exactly (a retried or repeated load). Conflict otherwise."""
        spec = self._spec(entry, "admin")
        registered = self._specs.get(entry.id)
        if registered is None:
            self._check_names(spec)  # before loading, not after
            return spec
        same = dataclasses.replace(spec, is_default=registered.is_default, source=registered.source)
        if same != registered:
            raise Conflict(
                f"model {entry.id!r} is already registered with another file or settings: "
                "use action swap to replace it",
                param="id",
            )
        return registered

    async def _load_spec(self, spec: ModelSpec, *, make_default: bool) -> LifecycleResult:
        slot = self._slots.get(spec.model_id)
        load_s = None
        if slot is None:
            await self._make_room()
            try:
                slot = await self._load_slot(spec)
            except InferfluxError:
                if spec.model_id not in self._specs:  # the caller has the error; no listing
                    self._errors.pop(spec.model_id, None)
                raise
            self._register(spec)
            self._slots[spec.model_id] = slot
            load_s = slot.load_s
        if make_default:
            self._make_default(spec.model_id)
        return LifecycleResult("load", spec.model_id, load_s=load_s)

    def _spec(self, entry: ManifestEntry, source: SpecSource) -> ModelSpec:
        return spec_from_entry(entry, self._plan.models_dir, self._plan.verifier, source)

    async def unload(self, model_id: str, *, forget: bool = False) -> LifecycleResult:
        async with self._lock:
            model_id = self._resolve(model_id)
            if model_id == self._default:
                raise Conflict(
                    f"model {model_id!r} is the default and cannot be unloaded: make another "
                    "model the default first",
                    param="id",
                )
            slot = self._slots.pop(model_id, None)
            if slot is not None:
                self._retire_later(slot)
            if forget:
                self._unregister(model_id)
                self._errors.pop(model_id, None)
            return LifecycleResult("unload", model_id, retiring=model_id if slot else None)

    async def load_adapter(self, entry: AdapterEntry, *, replace: bool = False) -> LifecycleResult:
        async with self._lock:
            base = self._specs[self._resolve(entry.base)]
            if base.adapters:
                raise Conflict(
                    f"{base.model_id!r} already is an adapter model: name its base model",
                    param="base",
                )
            spec = spec_from_adapter(entry, base, self._plan.models_dir, self._plan.verifier)
            registered = self._specs.get(spec.model_id)
            if registered is not None and not replace:
                raise Conflict(
                    f"the adapter {spec.model_id!r} is already loaded: use action swap to "
                    "replace it, or unload it",
                    param="id",
                )
            if registered is None:
                result = await self._load_spec(spec, make_default=False)
            else:
                result = await self._replace(spec)
            return dataclasses.replace(result, action="swap" if replace else "load")

    async def swap(self, entry: ManifestEntry) -> LifecycleResult:
        async with self._lock:
            return await self._swap(entry)

    async def _swap(self, entry: ManifestEntry) -> LifecycleResult:
        old_spec = self._specs.get(entry.id)
        if old_spec is None:
            raise ModelNotFound(
                f"model '{entry.id}' is not registered: use action load", param="id"
            )
        return await self._replace(self._spec(entry, old_spec.source))

    async def _replace(self, spec: ModelSpec) -> LifecycleResult:
        """Load `spec` beside the model with its id, switch, retire the old (lock held)."""
        self._check_names(spec)  # before loading, not after
        if spec.model_id not in self._slots:
            await self._make_room()
        slot = await self._load_slot(spec)
        old = self._slots.get(spec.model_id)
        self._register(spec)
        self._slots[spec.model_id] = slot  # the switch: new requests resolve to the new slot
        if spec.model_id == self._default or spec.is_default:
            self._make_default(spec.model_id)
        if old is not None:
            self._retire_later(old)
        logger.info("model %s swapped to %s", spec.model_id, spec.path)
        return LifecycleResult(
            "swap", spec.model_id, load_s=slot.load_s, retiring=spec.model_id if old else None
        )

    async def set_default(self, model_id: str) -> LifecycleResult:
        async with self._lock:
            spec = self._specs[self._resolve(model_id)]
            result = await self._load_spec(spec, make_default=True)
            return dataclasses.replace(result, action="set_default")

    async def sync_manifest(self, manifest: Manifest) -> None:
        async with self._lock:
            await self._sync(manifest)

    async def _sync(self, manifest: Manifest) -> None:
        wanted = {entry.id: entry for entry in manifest.models}
        for model_id in [i for i in self._applied if i not in wanted]:
            self._remove(model_id)
        for model_id, entry in wanted.items():
            if entry == self._applied.get(model_id):
                continue
            with _logged(f"manifest entry {model_id!r}", self._errors, model_id):
                if model_id in self._specs:
                    await self._swap(entry)
                else:
                    spec = self._spec(entry, "manifest")
                    self._register(spec)
                    await self._load_spec(spec, make_default=False)
        self._applied = wanted
        default = manifest.default_id()
        if default is not None and default != self._default and default in self._specs:
            with _logged(f"manifest default {default!r}", self._errors, default):
                await self._load_spec(self._specs[default], make_default=True)

    def _remove(self, model_id: str) -> None:
        """A manifest entry is gone: unregister and retire it (lock held)."""
        spec = self._specs.get(model_id)
        if spec is None or spec.source != "manifest":
            return
        if model_id == self._default:
            logger.error(
                "manifest: the default model %s was removed without naming another "
                "default; it keeps serving",
                model_id,
            )
            return
        self._unregister(model_id)
        self._errors.pop(model_id, None)
        slot = self._slots.pop(model_id, None)
        if slot is not None:
            self._retire_later(slot)
        logger.info("manifest: model %s removed", model_id)

    # -- background -----------------------------------------------------------------------
    async def _preload(self) -> None:
        """Load registered models after the default, up to the resident maximum."""
        for model_id in list(self._specs):
            if len(self._slots) >= self._settings.max_resident_models:
                return
            if model_id not in self._slots and model_id in self._specs:
                with contextlib.suppress(InferfluxError):  # logged and listed as failed
                    await self._ensure_loaded(model_id)

    async def _housekeeping(self) -> None:
        poll_s = self._settings.poll_interval_ms / 1000.0
        next_poll = time.monotonic() + poll_s
        while True:
            await asyncio.sleep(_TICK_S)
            try:
                await self._unload_expired()
                if self._watcher is not None and time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + poll_s
                    manifest = await asyncio.to_thread(self._watcher.poll)
                    if manifest is not None:
                        await self.sync_manifest(manifest)
            except Exception:  # NOTE: one bad tick must not stop the housekeeping
                logger.exception("model housekeeping failed")

    async def _unload_expired(self) -> None:
        """Retire idle models whose keep_alive ran out (skipped while the lock is held)."""
        if self._lock.locked():
            return
        now = time.monotonic()
        async with self._lock:
            for slot in list(self._slots.values()):
                expired = slot.expires_at is not None and slot.expires_at <= now
                if expired and not slot.num_leases and slot.model_id != self._default:
                    logger.info("model %s: keep_alive expired; unloading", slot.model_id)
                    del self._slots[slot.model_id]
                    self._retire_later(slot)


@contextlib.contextmanager
def _logged(what: str, errors: dict[str, str], model_id: str) -> Iterator[None]:
    """Log and record an InferfluxError instead of raising it (manifest changes)."""
    try:
        yield
    except InferfluxError as exc:
        errors[model_id] = exc.message
        logger.error("%s not applied: %s", what, exc.message)
