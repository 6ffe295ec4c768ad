"""The models' seams: `ModelDirectory` (what the API asks of the models: names, leases,
listings) and `ModelLifecycle` (the admin side: load, unload, swap, adapters, the
default, the manifest), and the views they answer with. `ModelHub` (hub.py) implements
both.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from inferflux.config.manifest import AdapterEntry, Manifest, ManifestEntry, ModelParameters
from inferflux.engine.protocol import ChannelStats, LoraAdapter, ModelInfo, WorkerStatus
from inferflux.models.serving import ServingState

ModelState = Literal["loaded", "loading", "registered", "retiring", "failed"]


@dataclass(frozen=True, slots=True)
class ModelView:
    """One model as listings show it. `info` is None until the model has been loaded."""

    model_id: str
    aliases: tuple[str, ...]
    path: str
    source: str  # config, manifest or admin
    is_default: bool
    state: ModelState
    info: ModelInfo | None = None
    num_in_flight: int = 0  # HTTP requests holding the model now
    load_s: float | None = None  # verify + vocabulary + first worker, seconds
    idle_s: float | None = None  # since its last request ended (resident models)
    expires_in_s: float | None = None  # Ollama keep_alive left; None = no deadline
    error: str | None = None  # why the last load failed (state "failed")
    registered: bool = True  # False: a manifest entry refused before registration
    workers: tuple[WorkerStatus, ...] = ()  # of a loaded or retiring model
    adapter_of: str | None = None  # a LoRA model: the id of its base model
    adapters: tuple[LoraAdapter, ...] = ()  # a LoRA model: its adapters
    system: str | None = None  # Ollama: its system prompt
    parameters: ModelParameters | None = None  # Ollama: its default options
    chat_template: str | None = None  # the template its entry sets (None: the GGUF's)
    mmproj: str = ""  # its multimodal projector GGUF (images in); "" = text only

    @property
    def vision(self) -> bool:
        """True when the model takes images (it has an mmproj), loaded or not."""
        return bool(self.mmproj) or (self.info is not None and self.info.vision)

    def listed(self) -> bool:
        """Shown by the client-facing listings (/v1/models, /api/tags)."""
        return self.registered and self.state != "retiring"


@dataclass(frozen=True, slots=True)
class LifecycleResult:
    """What an admin operation did."""

    action: str
    model_id: str
    load_s: float | None = None  # the new model's load, when one was loaded
    retiring: str | None = None  # the id of a model being drained and retired
    persisted: bool | None = None  # written to the manifest; None: nothing to write


class ModelDirectory(Protocol):
    """Which models exist, which are resident, and which one a request gets (the routes'
    side). One event loop."""

    def lease(
        self, name: str | None, adapter: str | None = None
    ) -> AbstractAsyncContextManager[ServingState]:
        """Hold the model `name` names (None/"": the default) for one request, loading it
        first if it is registered but not resident; with `adapter`, the model
        `<that model's id>:<adapter>` (its LoRA adapter). Raises ModelNotFound (404) for
        an unknown name, ModelLoadError if it cannot be loaded, ServiceUnavailable when
        every resident model is busy and none can make room."""
        ...

    def access_names(self, name: str | None, adapter: str | None = None) -> tuple[str, ...]:
        """The names a principal's `allowed_models` can grant the model `name` (and
        `adapter`) resolves to, checked before anything loads: its id, and a LoRA adapter
        model's base id. Raises ModelNotFound."""
        ...

    def default_serving(self) -> ServingState:
        """The default model's state (health, stats: no lease taken)."""
        ...

    def resident(self, name: str) -> ServingState | None:
        """The state of the model `name` names when it is loaded now (no lease, no load:
        descriptions only); None when it is not loaded. Raises ModelNotFound."""
        ...

    def models(self) -> list[ModelView]:
        """Every registered model, the default first, then by id."""
        ...

    def workers(self) -> list[WorkerStatus]:
        """The workers of every resident model, numbered 0..n-1 across models (metrics)."""
        ...

    def channels(self) -> list[ChannelStats]:
        """The KV channel of every resident model in disaggregated mode (metrics); none
        in unified mode."""
        ...

    def keep_alive(self, name: str, seconds: float) -> None:
        """Ollama `keep_alive`: unload `name` once idle for `seconds` (0 = as soon as
        idle; math.inf = never). The default model is never unloaded."""
        ...


class ModelLifecycle(Protocol):
    """The admin side: start, stop, load, unload, swap, set the default, follow the
    manifest, load LoRA adapters. Lifecycle changes run one at a time."""

    models_dir: Path  # where manifest and admin paths resolve (and Ollama blobs live)

    async def start(self) -> None:
        """Start the default model's engine (raises ModelLoadError if it cannot), then
        load the other registered models up to registry.max_resident_models."""
        ...

    async def shutdown(self) -> None:
        """Stop watching and stop every model's workers."""
        ...

    async def load(self, entry: ManifestEntry | str) -> LifecycleResult:
        """Register `entry` (or take the registered id) and make it resident; with
        `entry.default` it becomes the default once loaded. A failed load raises
        ModelLoadError/ModelVerificationFailed and changes nothing."""
        ...

    async def unload(self, model_id: str, *, forget: bool = False) -> LifecycleResult:
        """Retire a resident model (in-flight requests finish first). It stays registered
        (and in the manifest) and loads again on the next request that names it, unless
        `forget` (then it is unregistered and its manifest entry removed: 404 from now
        on). Conflict for the default."""
        ...

    async def load_adapter(self, entry: AdapterEntry, *, replace: bool = False) -> LifecycleResult:
        """Serve `<base id>:<entry.id>`: the base model's file with the LoRA adapter, in
        workers of its own (a context holds one adapter set, so no batch mixes sets).
        `replace` swaps the adapter of a loaded one (old requests finish on the old).
        Verification as for models; Conflict for an existing adapter without `replace`."""
        ...

    async def swap(self, entry: ManifestEntry) -> LifecycleResult:
        """Load `entry` beside the model with its id, switch new requests to it once it is
        ready, then retire the old one. On failure the old model keeps serving and the
        error is raised."""
        ...

    async def set_default(self, model_id: str) -> LifecycleResult:
        """Make a registered model the default (loading it first when needed)."""
        ...

    async def sync_manifest(self, manifest: Manifest) -> None:
        """Apply a changed manifest: load added entries, retire removed ones, swap changed
        ones, follow its default. Failures are logged and shown by `models()`."""
        ...

    async def register(self, entry: ManifestEntry) -> LifecycleResult:
        """Register `entry` without loading it (Ollama's create and copy), replacing the
        model with its id (a resident one is swapped). Written to the manifest."""
        ...

    async def entry_of(self, name: str) -> ManifestEntry:
        """An unsigned entry serving the file and settings of the model `name` names
        (hashing the file when its spec has no SHA-256). Raises ModelNotFound, Conflict
        (an adapter model, a file outside the models folder)."""
        ...
