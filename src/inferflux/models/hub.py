"""`ModelHub`: every model the server knows, behind the two seams of protocol.py.

Composes the three parts of the models' vocabulary (docs/architecture.md, "Glossary"):
`NameTable` (registered specs and their names, names.py), `Residency` (resident models and
their leases, LRU, keep_alive, residency.py) and `Lifecycle` (load, swap, unload,
adapters, the default, the manifest, lifecycle.py). Owns the listings (`models`,
`workers`), starting and stopping, and the housekeeping loop (keep_alive expiry, the
manifest watch). `ModelDirectory` is the API's side, `ModelLifecycle` the admin's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

from inferflux.config.manifest import AdapterEntry, Manifest, ManifestEntry, canonical_entry
from inferflux.config.registry_settings import RegistrySettings
from inferflux.engine.protocol import ChannelStats, WorkerStatus
from inferflux.errors import InferfluxError
from inferflux.models.catalog import Catalog
from inferflux.models.lifecycle import Lifecycle
from inferflux.models.loader import ModelLoader
from inferflux.models.manifest_watch import ManifestWatcher
from inferflux.models.materialize import entry_needs_preparation, fetch_entry
from inferflux.models.names import NameTable
from inferflux.models.protocol import LifecycleResult, ModelState, ModelView
from inferflux.models.residency import Residency
from inferflux.models.resident import ResidentModel
from inferflux.models.serving import ServingState
from inferflux.models.spec import ModelSpec

logger = logging.getLogger(__name__)

_TICK_S = 0.5


class ModelHub:
    """Every registered model and the resident ones. One event loop."""

    def __init__(
        self,
        settings: RegistrySettings,
        catalog: Catalog,
        default: ResidentModel,
        loader: ModelLoader,
    ) -> None:
        """`default` is the catalog's default model, built but not started (`start`)."""
        self._settings = settings
        self.models_dir = catalog.models_dir  # where URL models download, quantized ones go
        self._verifier = catalog.verifier
        self.names = NameTable(default.spec, catalog.others)
        self.residency = Residency(settings, default)
        self.lifecycle = Lifecycle(catalog, self.names, self.residency, loader)
        self.residency.load = self.lifecycle.load_registered
        path = catalog.manifest_path
        watch = path is not None and settings.poll_interval_ms > 0
        self._watcher = ManifestWatcher(path) if path is not None and watch else None

    # -- ModelDirectory -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(
        self, name: str | None, adapter: str | None = None
    ) -> AsyncIterator[ServingState]:
        spec = self.names.spec(name, adapter)
        async with self.residency.lease(spec.model_id) as serving:
            yield serving

    def access_names(self, name: str | None, adapter: str | None = None) -> tuple[str, ...]:
        spec = self.names.spec(name, adapter)
        return (spec.model_id, spec.base_id) if spec.base_id else (spec.model_id,)

    def default_serving(self) -> ServingState:
        resident = self.residency.get(self.names.default_id)
        assert resident is not None  # NOTE: the default is resident from start to shutdown
        return resident.serving

    def resident(self, name: str) -> ServingState | None:
        resident = self.residency.get(self.names.resolve(name))
        return resident.serving if resident is not None else None

    def keep_alive(self, name: str, seconds: float) -> None:
        self.residency.keep_alive(self.names.resolve(name), seconds, self.names.default_id)

    def workers(self) -> list[WorkerStatus]:
        statuses = [s for r in self.residency for s in r.serving.engine.workers()]
        return [dataclasses.replace(s, worker_id=i) for i, s in enumerate(statuses)]

    def channels(self) -> list[ChannelStats]:
        channels = (r.serving.engine.channel() for r in self.residency)
        return [c for c in channels if c is not None]

    def models(self) -> list[ModelView]:
        now = time.monotonic()
        views = [self._view(spec, now) for spec in self.names]
        views += [_retiring_view(r) for r in self.residency.retiring()]
        errors = self.lifecycle.errors
        failed = [i for i in errors if i not in self.names]
        views += [ModelView(i, (), "", "manifest", False, "failed", error=errors[i],
                            registered=False) for i in failed]  # fmt: skip
        return sorted(views, key=lambda v: (not v.is_default, v.model_id, v.state))

    def _view(self, spec: ModelSpec, now: float) -> ModelView:
        resident = self.residency.get(spec.model_id)
        errors = self.lifecycle.errors
        state: ModelState = "registered"
        if resident is not None:
            state = "loaded"
        elif self.residency.is_loading(spec.model_id):
            state = "loading"
        elif spec.model_id in errors:
            state = "failed"
        view = ModelView(
            spec.model_id, spec.aliases, str(spec.path), spec.source,
            spec.model_id == self.names.default_id, state, error=errors.get(spec.model_id),
            adapter_of=spec.base_id, adapters=spec.adapters, system=spec.system,
            parameters=spec.parameters, chat_template=spec.chat_template,
            mmproj=str(spec.mmproj) if spec.mmproj is not None else "",
        )  # fmt: skip
        if resident is None:
            return view
        expires = None if resident.expires_at is None else max(0.0, resident.expires_at - now)
        return dataclasses.replace(
            view,
            info=resident.serving.model_info,
            num_in_flight=resident.num_leases,
            load_s=resident.load_s,
            idle_s=None if resident.num_leases else now - resident.last_used_at,
            expires_in_s=expires,
            workers=tuple(resident.serving.engine.workers()),
        )

    # -- ModelLifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        started_at = time.monotonic()
        default = self.residency.get(self.names.default_id)
        assert default is not None  # NOTE: built with the hub
        await default.serving.engine.start()
        default.load_s = time.monotonic() - started_at
        self.residency.spawn(self._preload(), "models-preload")
        self.residency.spawn(self._housekeeping(), "models-housekeeping")

    async def shutdown(self) -> None:
        await self.residency.shutdown()

    async def load(self, entry: ManifestEntry | str) -> LifecycleResult:
        if isinstance(entry, ManifestEntry):
            await self.prepare(entry)
        return await self.lifecycle.load(entry)

    async def unload(self, model_id: str, *, forget: bool = False) -> LifecycleResult:
        return await self.lifecycle.unload(model_id, forget=forget)

    async def load_adapter(self, entry: AdapterEntry, *, replace: bool = False) -> LifecycleResult:
        return await self.lifecycle.load_adapter(entry, replace=replace)

    async def swap(self, entry: ManifestEntry) -> LifecycleResult:
        await self.prepare(entry)
        return await self.lifecycle.swap(entry)

    async def set_default(self, model_id: str) -> LifecycleResult:
        return await self.lifecycle.set_default(model_id)

    async def sync_manifest(self, manifest: Manifest) -> None:
        await self._prepare_changed(manifest)
        await self.lifecycle.sync_manifest(manifest)

    async def _prepare_changed(self, manifest: Manifest) -> None:
        for entry in manifest.models:
            if entry != self.lifecycle.applied.get(entry.id):
                with contextlib.suppress(InferfluxError):  # logged; the sync records it
                    await self.prepare(entry)

    async def _follow_manifest(self, watcher: ManifestWatcher) -> None:
        """Apply the manifest file when it changed, unless this process wrote it after
        the read began (then the next poll reads it again: a stale read never undoes an
        admin change written to it)."""
        num_writes = self.lifecycle.num_writes
        manifest = await asyncio.to_thread(watcher.poll)
        if manifest is None:
            return
        await self._prepare_changed(manifest)
        if not await self.lifecycle.sync_manifest(manifest, unless_written_since=num_writes):
            watcher.reread()

    async def register(self, entry: ManifestEntry) -> LifecycleResult:
        return await self.lifecycle.register(entry)

    async def entry_of(self, name: str) -> ManifestEntry:
        return await self.lifecycle.entry_of(name)

    async def prepare(self, entry: ManifestEntry) -> None:
        """Download a URL entry's file (and mmproj) and make its `quantization`, on a thread (once:
        later calls find the files). Raises what models/materialize.py raises, logged."""
        if not entry_needs_preparation(entry):
            return
        try:  # the signature first: an entry refused anyway fetches nothing
            self._verifier.verify(entry.id, canonical_entry(entry), entry.signature)
            await asyncio.to_thread(fetch_entry, entry, self.models_dir)
        except InferfluxError as exc:
            logger.error("model %s: %s", entry.id, exc.message)
            raise

    # -- background -----------------------------------------------------------------------
    async def _preload(self) -> None:
        """Load registered models after the default, up to the resident maximum."""
        for spec in self.names:
            if len(self.residency) >= self._settings.max_resident_models:
                return
            if spec.model_id not in self.residency and spec.model_id in self.names:
                with contextlib.suppress(InferfluxError):  # logged and listed as failed
                    await self.residency.ensure_loaded(spec.model_id)

    async def _housekeeping(self) -> None:
        poll_s = self._settings.poll_interval_ms / 1000.0
        next_poll = time.monotonic() + poll_s
        while True:
            await asyncio.sleep(_TICK_S)
            try:
                self._unload_expired()
                if self._watcher is not None and time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + poll_s
                    await self._follow_manifest(self._watcher)
            except Exception:  # NOTE: one bad tick must not stop the housekeeping
                logger.exception("model housekeeping failed")

    def _unload_expired(self) -> None:
        """Retire idle models whose keep_alive ran out (skipped while a lifecycle change
        runs)."""
        if not self.lifecycle.lock.locked():
            self.residency.unload_expired(self.names.default_id)


def _retiring_view(resident: ResidentModel) -> ModelView:
    spec = resident.spec
    return ModelView(
        resident.model_id, spec.aliases, str(spec.path), spec.source, False, "retiring",
        resident.serving.model_info, resident.num_leases, resident.load_s,
        workers=tuple(resident.serving.engine.workers()),
        adapter_of=spec.base_id, adapters=spec.adapters,
        mmproj=str(spec.mmproj) if spec.mmproj is not None else "",
    )  # fmt: skip
