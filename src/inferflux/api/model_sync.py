"""`ModelSync`: the models loaded through the admin API (`POST /v1/admin/models`)
replicated across replicas through Redis, when `redis.url` is set and `redis.model_sync`
is on.

The set of admin-loaded models is one `DocumentSync` document (security/replication.py)
under `<redis.policy_namespace>:models`. A snapshot (JSON, nothing secret) holds the
manifest entry of every admin-loaded model still registered on the replica that published
it (what `ManifestStore` persists: file, SHA-256, settings, aliases), which of them are
resident there, and the default model's id, at a version Redis decides (compare and set).

Apply, then publish: an admin change runs here first (a load is verified and loaded
before anything is announced: a load that fails publishes nothing), then the new state is
published as the next version. When another replica published first, its snapshot is
applied here and the change is made again on top of it. While Redis is unreachable an
admin change is refused with 503 ("model replication unavailable"); a publish that fails
after the change was made leaves it on this replica only (the answer is a 503 saying so).

A replica applies another's snapshot model by model (`plan`): it loads entries it does not
have (an `hf://` path downloads here too), swaps entries whose fields changed, unloads the
models the snapshot holds as not resident, forgets admin models the snapshot dropped, and
moves the default. A step that fails here (a file only the publisher has, a download that
fails) is logged and listed in `failed` (`/server/stats` → `model_replication`), and the
version counts as applied: the replica keeps serving what it has and tries again only
when a newer version names that model (never a reload loop).

Owns the document adapter, the diff and `make_model_sync`. Does not own how models load
(models/lifecycle.py) nor the follow loop (security/replication.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from inferflux.config.manifest import ManifestEntry
from inferflux.config.security_settings import RedisSettings
from inferflux.errors import InferfluxError, ServiceUnavailable
from inferflux.models.manifest_store import entry_fields
from inferflux.models.protocol import LifecycleResult, ModelLifecycle, ModelView
from inferflux.security.replication import (
    REDIS_ERRORS,
    DocumentSync,
    LockedDocument,
    Newer,
    SnapshotError,
    SyncedChanges,
    SyncStatus,
    redis_document_sync,
)

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5

Fields = dict[str, Any]  # a manifest entry's fields, as `entry_fields` writes them


@dataclass(frozen=True, slots=True)
class ModelsSnapshot:
    """The admin-loaded models of one replica: their entries (without the default flag),
    which are resident, and the default model's id."""

    entries: Mapping[str, Fields] = field(default_factory=dict)
    loaded: frozenset[str] = frozenset()
    default: str | None = None


@dataclass(frozen=True, slots=True)
class Here:
    """What this replica serves: registered model ids and their source, resident ids."""

    sources: Mapping[str, str]
    resident: frozenset[str]
    default: str | None


@dataclass(frozen=True, slots=True)
class Step:
    """One lifecycle call: `load` (an entry, or a registered id), `register`, `unload`,
    `forget` (unload and unregister) or `set_default`."""

    action: str
    model_id: str
    entry: Fields | None = None


@dataclass(frozen=True, slots=True)
class ModelReplicationStatus:
    """`/server/stats` → `model_replication`: the sync's state and the failed steps."""

    sync: SyncStatus
    failed: Mapping[str, str]


def here_of(views: list[ModelView]) -> Here:
    listed = [view for view in views if view.registered]
    return Here(
        sources={view.model_id: view.source for view in listed},
        resident=frozenset(view.model_id for view in listed if view.state == "loaded"),
        default=next((view.model_id for view in listed if view.is_default), None),
    )


def plan(wanted: ModelsSnapshot, held: Mapping[str, Fields], here: Here) -> list[Step]:
    """The steps that make `here` serve `wanted`, given the entries applied before
    (`held`): loads and swaps first, then the default, then unloads and removals (the
    old default may be among them). A default this replica does not know is skipped."""
    steps = [s for i in wanted.entries.items() for s in _entry_steps(wanted, held, here, *i)]
    default = wanted.default
    known = default in here.sources or default in wanted.entries
    if default is not None and default != here.default and known:
        steps.append(Step("set_default", default))
    for model_id in sorted(here.resident & set(wanted.entries) - wanted.loaded):
        if model_id != default:
            steps.append(Step("unload", model_id))
    for model_id in sorted(set(held) - set(wanted.entries)):
        if here.sources.get(model_id) == "admin" and model_id != default:
            steps.append(Step("forget", model_id))
    return steps


def _entry_steps(
    wanted: ModelsSnapshot, held: Mapping[str, Fields], here: Here, model_id: str, entry: Fields
) -> list[Step]:
    """What one entry of `wanted` needs here: registered (loaded when `wanted` holds it
    resident), swapped when its fields changed since the version applied before."""
    resident_wanted = model_id in wanted.loaded
    if model_id not in here.sources:
        return [Step("load" if resident_wanted else "register", model_id, entry)]
    steps = []
    if model_id in held and held[model_id] != entry:
        steps.append(Step("register", model_id, entry))  # swapped when resident
    if resident_wanted and model_id not in here.resident:
        steps.append(Step("load", model_id))
    return steps


async def run_step(lifecycle: ModelLifecycle, step: Step) -> LifecycleResult:
    entry = None if step.entry is None else ManifestEntry.model_validate(step.entry)
    if step.action == "load":
        return await lifecycle.load(entry if entry is not None else step.model_id)
    if step.action == "register" and entry is not None:
        return await lifecycle.register(entry)
    if step.action == "set_default":
        return await lifecycle.set_default(step.model_id)
    return await lifecycle.unload(step.model_id, forget=step.action == "forget")


class ModelsDocument(LockedDocument):
    """`ReplicatedDocument` over the models of one replica (module docstring)."""

    label = "models"

    def __init__(self, lifecycle: ModelLifecycle, views: Callable[[], list[ModelView]]) -> None:
        super().__init__()
        self.lifecycle = lifecycle
        self.views = views
        self.version = 0
        self.entries: dict[str, Fields] = {}  # admin-loaded models: their entries
        self.failed: dict[str, str] = {}  # model id → why the last applied version failed
        self.last = ModelsSnapshot()  # the version held, as applied or published

    def held_version(self) -> int:
        return self.version

    def snapshot(self) -> ModelsSnapshot:
        """This replica's admin models now: entries of models no longer registered are
        dropped, except those that failed to load here (the cluster still holds them as
        the version applied did: a change published here must not drop them)."""
        here = here_of(self.views())
        self.failed = {i: why for i, why in self.failed.items() if i not in here.sources}
        kept = set(here.sources) | set(self.failed)
        self.entries = {i: e for i, e in self.entries.items() if i in kept}
        loaded = here.resident | (set(self.failed) & self.last.loaded)
        return ModelsSnapshot(dict(self.entries), loaded & set(self.entries), here.default)

    def sealed(self) -> bytes:
        return encode(self.last, self.version)

    async def install(self, blob: bytes, version: int) -> bool:
        """Steps that fail are recorded, not raised."""
        if version <= self.version:
            return False
        wanted = decode(blob, version)
        failed: dict[str, str] = {}
        for step in plan(wanted, self.entries, here_of(self.views())):
            try:
                await run_step(self.lifecycle, step)
            except InferfluxError as exc:
                failed[step.model_id] = exc.message
                logger.error(
                    "models version %d: %s %s failed here: %s",
                    version, step.action, step.model_id, exc.message,
                )  # fmt: skip
            except Exception as exc:  # a bug: recorded, and the version still counts (no loop)
                failed[step.model_id] = f"{type(exc).__name__}: {exc}"
                logger.exception(
                    "models version %d: %s %s failed here", version, step.action, step.model_id
                )
        self.entries = dict(wanted.entries)
        self.failed = failed
        self.last = wanted
        self.version = version
        return True


class ModelSync(SyncedChanges):
    """Admin model changes through the cluster (module docstring). `start` once on the
    event loop (after the default model started), `close` at shutdown."""

    def __init__(self, document: ModelsDocument, sync: DocumentSync) -> None:
        super().__init__(sync)
        self._document = document

    def status(self) -> ModelReplicationStatus:
        return ModelReplicationStatus(self._sync.status(), dict(self._document.failed))

    def version(self) -> int:
        return self._document.version

    def num_failed(self) -> int:
        return len(self._document.failed)

    async def run(
        self, change: Callable[[], Awaitable[LifecycleResult]], entry: ManifestEntry | None
    ) -> LifecycleResult:
        """Make `change` here (`entry`: the entry it loads or swaps in), then publish the
        resulting models. Raises what `change` raises, or ServiceUnavailable."""
        document = self._document
        async with document.lock:
            if not self._sync.status().redis_up:
                raise ServiceUnavailable(
                    "model replication unavailable (Redis cannot be reached); the change "
                    "was not made, retry when it is back"
                )
            for _ in range(MAX_ATTEMPTS):
                base = document.version
                result = await change()
                if entry is not None:
                    document.entries[entry.id] = _without_default(entry_fields(entry))
                newer = await self._publish(base)
                if newer is None:
                    return result
                if newer.blob is None:
                    break
                if entry is not None:  # not forgotten by the newer version: made again
                    document.entries.pop(entry.id, None)
                try:
                    await document.install(newer.blob, newer.version)
                except SnapshotError:
                    break
        raise ServiceUnavailable(
            "model replication: the cluster's newer models cannot be applied here or "
            "other changes kept landing first; the change was made on this replica only"
        )

    async def _publish(self, base: int) -> Newer | None:
        document = self._document
        snapshot = document.snapshot()
        try:
            newer = await self._sync.publish(encode(snapshot, base + 1), base, base + 1)
        except REDIS_ERRORS:
            raise ServiceUnavailable(
                "model replication unavailable (Redis cannot be reached): the change was "
                "made on this replica only"
            ) from None
        if newer is None:
            document.version = base + 1
            document.last = snapshot
        return newer


def _without_default(fields: Fields) -> Fields:
    return {key: value for key, value in fields.items() if key != "default"}


def encode(snapshot: ModelsSnapshot, version: int) -> bytes:
    document = {
        "version": version,
        "models": dict(snapshot.entries),
        "loaded": sorted(snapshot.loaded),
        "default": snapshot.default,
    }
    return json.dumps(document, sort_keys=True).encode()


def decode(blob: bytes, version: int) -> ModelsSnapshot:
    try:
        document = json.loads(blob)
    except ValueError:
        raise SnapshotError("not JSON") from None
    if not isinstance(document, dict) or document.get("version") != version:
        raise SnapshotError(f"not a models snapshot of version {version}")
    models, loaded, default = (
        document.get("models"),
        document.get("loaded"),
        document.get("default"),
    )
    if not isinstance(models, dict) or not isinstance(loaded, list):
        raise SnapshotError("has no `models` mapping or `loaded` list")
    if default is not None and not isinstance(default, str):
        raise SnapshotError("its `default` is not a model id")
    entries: dict[str, Fields] = {}
    for model_id, fields in models.items():
        try:
            entry = ManifestEntry.model_validate(fields)
        except ValidationError as exc:
            raise SnapshotError(f"entry {model_id!r} is not a manifest entry: {exc}") from None
        if entry.id != model_id:
            raise SnapshotError(f"entry {model_id!r} names another id")
        entries[model_id] = _without_default(entry_fields(entry))
    return ModelsSnapshot(entries, frozenset(str(i) for i in loaded), default)


def replication_json(status: ModelReplicationStatus) -> dict[str, object]:
    return {**dataclasses.asdict(status.sync), "failed": dict(status.failed)}


def make_model_sync(
    redis: RedisSettings, lifecycle: ModelLifecycle, views: Callable[[], list[ModelView]]
) -> ModelSync | None:
    """The replication of the admin-loaded models (None without `redis.url` or with
    `redis.model_sync` off)."""
    if redis.url is None or not redis.model_sync:
        return None
    document = ModelsDocument(lifecycle, views)
    sync = redis_document_sync(document, redis, ":models")
    return ModelSync(document, sync)
