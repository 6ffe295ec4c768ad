"""`Lifecycle`: the operations that change which models exist and which are resident.

Owns: loading a registered model on first use (`load_registered`), the admin operations
(load, unload, swap, set the default, load or replace a LoRA adapter), applying a changed
manifest, the reason each model's last load failed, and the lock that makes every one of
these run alone. Uses the name table (names.py) and the residency (residency.py); leases
never wait for the lock when the model is resident.

Hot swap: the new model loads (verify, vocabulary, its own workers) while the old one
serves; once it is ready the id points to it, in one step of the event loop, so every
request resolved after that gets the new model and every request that holds the old one
finishes there. The old model then drains (`ResidentModel.retire`): its workers stop,
taking their KV and prefix cache with them, and the new model's stats start from zero. A
load that fails changes nothing and raises.

Persistence: with a manifest (`registry.path`), every admin change is written back to it
(models/manifest_store.py), so a restart serves the same models: a load or swap adds or
replaces the entry (its settings, aliases and default flag), `set_default` moves the flag,
`unload(forget=True)` (Ollama's delete) removes the entry, a `register` (Ollama's create
and copy) adds it. A plain `unload` only stops serving now: the model stays registered and
listed in the manifest, and loads again on the next request that names it. LoRA adapter
models are not persisted. What a change wrote counts as applied (other entries stay as
they were applied, so an operator's pending edit is still picked up), and a watch read
older than a write is not applied: the watch reading the file back changes nothing
(no reload loop) and never undoes a change. Without a manifest nothing is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator

import yaml

from inferflux.config.manifest import AdapterEntry, Manifest, ManifestEntry
from inferflux.engine.model_verify import sha256_of_path
from inferflux.errors import ConfigError, Conflict, InferfluxError, ModelNotFound
from inferflux.models.catalog import Catalog
from inferflux.models.loader import ModelLoader
from inferflux.models.manifest_store import ManifestStore
from inferflux.models.names import NameTable
from inferflux.models.protocol import LifecycleResult
from inferflux.models.residency import Residency
from inferflux.models.resident import ResidentModel
from inferflux.models.spec import (
    ModelSpec,
    SpecSource,
    entry_from_spec,
    spec_from_adapter,
    spec_from_entry,
)

logger = logging.getLogger(__name__)


class Lifecycle:
    """Lifecycle operations over one name table and one residency. One event loop."""

    def __init__(
        self, catalog: Catalog, names: NameTable, residency: Residency, loader: ModelLoader
    ) -> None:
        self._catalog = catalog
        self._names = names
        self._residency = residency
        self._loader = loader
        self.lock = asyncio.Lock()
        self.errors: dict[str, str] = {}  # model id → why its last load failed
        manifest = catalog.manifest
        self.applied = {e.id: e for e in manifest.models} if manifest is not None else {}
        path = catalog.manifest_path
        self._store = ManifestStore(path) if path is not None else None
        self.num_writes = 0  # manifest writes so far (a read before one is stale)

    # -- first use ------------------------------------------------------------------------
    async def load_registered(self, model_id: str) -> ResidentModel:
        """Make a registered model resident (a request named it)."""
        async with self.lock:
            resident = self._residency.get(model_id)
            if resident is not None:
                return resident
            spec = self._names.get(model_id)
            if spec is None:
                raise ModelNotFound(f"model '{model_id}' not found", param="model")
            await self._residency.make_room(self._names.default_id)
            resident = await self._load(spec)
            self._residency.put(resident)
            return resident

    async def _load(self, spec: ModelSpec) -> ResidentModel:
        """Load `spec` (lock held), recording why when it fails."""
        logger.info("loading model %s from %s", spec.model_id, spec.path)
        try:
            resident = await self._loader.load(spec)
        except InferfluxError as exc:
            self.errors[spec.model_id] = exc.message
            logger.error("model %s failed to load: %s", spec.model_id, exc.message)
            raise
        self.errors.pop(spec.model_id, None)
        logger.info("model %s loaded in %.2fs", spec.model_id, resident.load_s)
        return resident

    # -- admin operations -----------------------------------------------------------------
    async def load(self, entry: ManifestEntry | str) -> LifecycleResult:
        async with self.lock:
            if isinstance(entry, str):
                spec = self._names.spec(entry)
                return await self._load_spec(spec, make_default=False)
            spec = self._admin_spec(entry)
            new = spec.model_id not in self._names
            result = await self._load_spec(spec, make_default=entry.default)
            if new or entry.default:
                result = await self._persist(result, lambda store: store.upsert(entry))
            return result

    def _admin_spec(self, entry: ManifestEntry) -> ModelSpec:
        """The spec an admin `load` names: a new one, or the registered one when the
        entry repeats it exactly (a retried or repeated load). Conflict otherwise."""
        spec = self._spec(entry, "admin")
        registered = self._names.get(entry.id)
        if registered is None:
            self._names.check(spec)  # before loading, not after
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
        resident = self._residency.get(spec.model_id)
        load_s = None
        if resident is None:
            await self._residency.make_room(self._names.default_id)
            try:
                resident = await self._load(spec)
            except InferfluxError:
                if spec.model_id not in self._names:  # the caller has the error; no listing
                    self.errors.pop(spec.model_id, None)
                raise
            self._names.register(spec)
            self._residency.put(resident)
            load_s = resident.load_s
        if make_default:
            self._make_default(spec.model_id)
        return LifecycleResult("load", spec.model_id, load_s=load_s)

    def _spec(self, entry: ManifestEntry, source: SpecSource) -> ModelSpec:
        return spec_from_entry(entry, self._catalog.models_dir, self._catalog.verifier, source)

    def _make_default(self, model_id: str) -> None:
        """Point the default at a resident model (lock held)."""
        self._names.set_default(model_id)
        logger.info("model %s is the default", model_id)

    async def unload(self, model_id: str, *, forget: bool = False) -> LifecycleResult:
        async with self.lock:
            model_id = self._names.resolve(model_id)
            if model_id == self._names.default_id:
                raise Conflict(
                    f"model {model_id!r} is the default and cannot be unloaded: make another "
                    "model the default first",
                    param="id",
                )
            resident = self._residency.remove(model_id)
            if resident is not None:
                self._residency.retire_later(resident)
            result = LifecycleResult("unload", model_id, retiring=model_id if resident else None)
            if not forget:
                return result
            self._names.unregister(model_id)
            self.errors.pop(model_id, None)
            return await self._persist(result, lambda store: store.remove(model_id))

    async def load_adapter(self, entry: AdapterEntry, *, replace: bool = False) -> LifecycleResult:
        async with self.lock:
            base = self._names.spec(entry.base)
            if base.adapters:
                raise Conflict(
                    f"{base.model_id!r} already is an adapter model: name its base model",
                    param="base",
                )
            catalog = self._catalog
            spec = spec_from_adapter(entry, base, catalog.models_dir, catalog.verifier)
            registered = self._names.get(spec.model_id)
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
        async with self.lock:
            result = await self._swap(entry)
            return await self._persist(result, lambda store: store.upsert(entry))

    async def _swap(self, entry: ManifestEntry) -> LifecycleResult:
        old_spec = self._names.get(entry.id)
        if old_spec is None:
            raise ModelNotFound(
                f"model '{entry.id}' is not registered: use action load", param="id"
            )
        return await self._replace(self._spec(entry, old_spec.source))

    async def _replace(self, spec: ModelSpec) -> LifecycleResult:
        """Load `spec` beside the model with its id, switch, retire the old (lock held)."""
        self._names.check(spec)  # before loading, not after
        if spec.model_id not in self._residency:
            await self._residency.make_room(self._names.default_id)
        resident = await self._load(spec)
        self._names.register(spec)
        old = self._residency.put(resident)  # the switch: new leases get the new model
        if spec.model_id == self._names.default_id or spec.is_default:
            self._make_default(spec.model_id)
        if old is not None:
            self._residency.retire_later(old)
        logger.info("model %s swapped to %s", spec.model_id, spec.path)
        return LifecycleResult(
            "swap", spec.model_id, load_s=resident.load_s, retiring=spec.model_id if old else None
        )

    async def set_default(self, model_id: str) -> LifecycleResult:
        async with self.lock:
            spec = self._names.spec(model_id)
            result = await self._load_spec(spec, make_default=True)
            result = dataclasses.replace(result, action="set_default")
            return await self._persist(result, lambda store: store.set_default(spec.model_id))

    # -- Ollama's create and copy ---------------------------------------------------------
    async def register(self, entry: ManifestEntry) -> LifecycleResult:
        """Add `entry` without loading it (it loads on first use), or replace the model
        with its id: swapped when it is resident, else its registration replaced."""
        async with self.lock:
            old = self._names.get(entry.id)
            if old is not None and entry.id in self._residency:
                result = await self._swap(entry)
            else:
                spec = self._spec(entry, old.source if old is not None else "admin")
                if old is not None and old.is_default:
                    spec = dataclasses.replace(spec, is_default=True)
                self._names.register(spec)
                self.errors.pop(entry.id, None)
                result = LifecycleResult("register", entry.id)
            return await self._persist(result, lambda store: store.upsert(entry))

    async def entry_of(self, name: str) -> ManifestEntry:
        """A manifest entry serving the file and settings of the model `name` names,
        under its id (no aliases, not the default, unsigned). Raises ModelNotFound, and
        Conflict for an adapter model or a file outside the models folder."""
        spec = self._names.spec(name)
        if spec.adapters:
            raise Conflict(f"{spec.model_id!r} is a LoRA adapter model", param="model")
        sha256 = spec.sha256
        if sha256 is None:
            sha256 = await asyncio.to_thread(sha256_of_path, spec.path)
        mmproj_sha256 = spec.mmproj_sha256
        if spec.mmproj is not None and mmproj_sha256 is None:
            mmproj_sha256 = await asyncio.to_thread(sha256_of_path, spec.mmproj)
        try:
            return entry_from_spec(spec, self._catalog.models_dir, sha256, mmproj_sha256)
        except ValueError:
            raise Conflict(
                f"the file of {spec.model_id!r} is outside the models folder (registry.models_dir)",
                param="model",
            ) from None

    # -- persistence ----------------------------------------------------------------------
    async def _persist(
        self, result: LifecycleResult, change: Callable[[ManifestStore], Manifest | None]
    ) -> LifecycleResult:
        """Write `change` to the manifest (lock held) and record what it wrote as applied.
        A write that fails is logged; the change in memory stands."""
        store = self._store
        if store is None:
            return result
        try:
            written = await asyncio.to_thread(change, store)
        except (OSError, ConfigError, yaml.YAMLError) as exc:
            logger.error("model manifest %s not updated: %s", store.path, exc)
            return dataclasses.replace(result, persisted=False)
        self.num_writes += 1
        if written is not None:
            self.applied = _applied_after(self.applied, written, result.model_id)
        return dataclasses.replace(result, persisted=written is not None)

    # -- the manifest ---------------------------------------------------------------------
    async def sync_manifest(
        self, manifest: Manifest, *, unless_written_since: int | None = None
    ) -> bool:
        """Apply `manifest`; with `unless_written_since` (a `num_writes` read before the
        file was), not when this process wrote the file since: that read may predate the
        write, and applying it would undo the write. False when skipped (read again)."""
        async with self.lock:
            if unless_written_since is not None and unless_written_since != self.num_writes:
                return False
            await self._sync(manifest)
            return True

    async def _sync(self, manifest: Manifest) -> None:
        wanted = {entry.id: entry for entry in manifest.models}
        for model_id in [i for i in self.applied if i not in wanted]:
            self._remove(model_id)
        for model_id, entry in wanted.items():
            if entry == self.applied.get(model_id):
                continue
            with _logged(f"manifest entry {model_id!r}", self.errors, model_id):
                if model_id in self._names:
                    await self._swap(entry)
                else:
                    spec = self._spec(entry, "manifest")
                    self._names.register(spec)
                    await self._load_spec(spec, make_default=False)
        self.applied = wanted
        default = manifest.default_id()
        default_spec = self._names.get(default) if default is not None else None
        if default_spec is not None and default != self._names.default_id:
            with _logged(f"manifest default {default!r}", self.errors, default_spec.model_id):
                await self._load_spec(default_spec, make_default=True)

    def _remove(self, model_id: str) -> None:
        """A manifest entry is gone (an operator removed it, or an admin change written
        earlier): unregister and retire it (lock held)."""
        spec = self._names.get(model_id)
        if spec is None or spec.source == "config":  # admin: an entry it persisted
            return
        if model_id == self._names.default_id:
            logger.error(
                "manifest: the default model %s was removed without naming another "
                "default; it keeps serving",
                model_id,
            )
            return
        self._names.unregister(model_id)
        self.errors.pop(model_id, None)
        resident = self._residency.remove(model_id)
        if resident is not None:
            self._residency.retire_later(resident)
        logger.info("manifest: model %s removed", model_id)


def _applied_after(
    applied: dict[str, ManifestEntry], written: Manifest, model_id: str
) -> dict[str, ManifestEntry]:
    """What is applied once this process wrote `written` for a change to `model_id`: that
    entry as written (or gone), and the default flags as written; every other entry as
    applied before, so an operator's edit the write carried along is still applied by the
    watch (an entry it added, removed or changed)."""
    entries = {entry.id: entry for entry in written.models}
    after = dict(applied)
    for entry_id, entry in entries.items():
        old = applied.get(entry_id)
        if entry_id == model_id or (old is not None and _flag_only(old, entry)):
            after[entry_id] = entry
    if model_id not in entries:
        after.pop(model_id, None)
    return after


def _flag_only(old: ManifestEntry, new: ManifestEntry) -> bool:
    """`new` is `old` with its default flag moved (set_default, a load with `default`)."""
    return old.default != new.default and old.model_copy(update={"default": new.default}) == new


@contextlib.contextmanager
def _logged(what: str, errors: dict[str, str], model_id: str) -> Iterator[None]:
    """Log and record an InferfluxError instead of raising it (manifest changes)."""
    try:
        yield
    except InferfluxError as exc:
        errors[model_id] = exc.message
        logger.error("%s not applied: %s", what, exc.message)
