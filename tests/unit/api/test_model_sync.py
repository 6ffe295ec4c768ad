"""Model replication's document logic: a snapshot read back only as its version, the plan
that turns a replica into the snapshot (loads, swaps, the default, unloads, removals),
and a replica that cannot load one model: it records why, takes the version anyway and
does not try again until a newer version names the model."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from inferflux.api.model_sync import (
    Here,
    ModelsDocument,
    ModelsSnapshot,
    ModelSync,
    Step,
    decode,
    encode,
    plan,
)
from inferflux.config.manifest import ManifestEntry
from inferflux.errors import ModelLoadError, ServiceUnavailable
from inferflux.models.protocol import LifecycleResult, ModelView
from inferflux.security.replication import Newer, SnapshotError, SyncStatus

SHA = "ab" * 32


def _entry(model_id: str, **fields: object) -> dict[str, object]:
    return {"id": model_id, "path": f"{model_id}.gguf", "sha256": SHA, **fields}


@dataclass
class FakeLifecycle:
    """Registered ids (→ source), resident ids and the default; `missing` files fail."""

    sources: dict[str, str] = field(default_factory=lambda: {"base": "config"})
    resident: set[str] = field(default_factory=lambda: {"base"})
    default: str = "base"
    missing: set[str] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)

    def views(self) -> list[ModelView]:
        return [
            ModelView(
                model_id,
                (),
                f"{model_id}.gguf",
                source,
                model_id == self.default,
                "loaded" if model_id in self.resident else "registered",
            )  # fmt: skip
            for model_id, source in self.sources.items()
        ]

    async def load(self, entry: ManifestEntry | str) -> LifecycleResult:
        model_id = entry if isinstance(entry, str) else entry.id
        self.calls.append(("load", model_id))
        if model_id in self.missing:
            raise ModelLoadError(f"{model_id}.gguf: no such file")
        self.sources.setdefault(model_id, "admin")
        self.resident.add(model_id)
        return LifecycleResult("load", model_id)

    async def register(self, entry: ManifestEntry) -> LifecycleResult:
        self.calls.append(("register", entry.id))
        self.sources.setdefault(entry.id, "admin")
        return LifecycleResult("register", entry.id)

    async def unload(self, model_id: str, *, forget: bool = False) -> LifecycleResult:
        self.calls.append(("forget" if forget else "unload", model_id))
        self.resident.discard(model_id)
        if forget:
            del self.sources[model_id]
        return LifecycleResult("unload", model_id)

    async def set_default(self, model_id: str) -> LifecycleResult:
        self.calls.append(("set_default", model_id))
        self.default = model_id
        self.resident.add(model_id)
        return LifecycleResult("set_default", model_id)


def _document(lifecycle: FakeLifecycle) -> ModelsDocument:
    return ModelsDocument(lifecycle, lifecycle.views)  # type: ignore[arg-type]


def test_a_snapshot_reads_back_only_as_its_version():
    snapshot = ModelsSnapshot({"m": _entry("m")}, frozenset({"m"}), "base")
    assert decode(encode(snapshot, 3), 3) == snapshot
    with pytest.raises(SnapshotError, match="version 4"):
        decode(encode(snapshot, 3), 4)
    with pytest.raises(SnapshotError, match="not JSON"):
        decode(b"\x00", 1)
    with pytest.raises(SnapshotError, match="not a manifest entry"):
        decode(encode(ModelsSnapshot({"m": {"id": "m"}}), 1), 1)
    with pytest.raises(SnapshotError, match="another id"):
        decode(encode(ModelsSnapshot({"m": _entry("n")}), 1), 1)


def test_the_plan_loads_swaps_moves_the_default_then_unloads_and_forgets():
    here = Here(
        sources={"base": "config", "kept": "admin", "idle": "admin", "gone": "admin"},
        resident=frozenset({"base", "kept", "idle", "gone"}),
        default="base",
    )
    held = {"kept": _entry("kept"), "idle": _entry("idle"), "gone": _entry("gone")}
    wanted = ModelsSnapshot(
        {"new": _entry("new"), "kept": _entry("kept", n_ctx=512), "idle": _entry("idle")},
        frozenset({"new", "kept"}),
        "new",
    )
    assert plan(wanted, held, here) == [
        Step("load", "new", _entry("new")),
        Step("register", "kept", _entry("kept", n_ctx=512)),
        Step("set_default", "new"),
        Step("unload", "idle"),
        Step("forget", "gone"),
    ]


def test_the_plan_leaves_what_matches_and_a_default_unknown_here():
    here = Here({"base": "config", "m": "admin"}, frozenset({"base", "m"}), "base")
    wanted = ModelsSnapshot({"m": _entry("m")}, frozenset({"m"}), "other-hosts-model")
    assert plan(wanted, {"m": _entry("m")}, here) == []


def test_a_model_that_fails_here_is_recorded_and_not_retried_until_a_newer_version():
    lifecycle = FakeLifecycle(missing={"only-a"})
    document = _document(lifecycle)
    wanted = ModelsSnapshot(
        {"only-a": _entry("only-a"), "both": _entry("both")}, frozenset({"only-a", "both"}), "base"
    )
    assert asyncio.run(document.apply(encode(wanted, 1), 1)) is True
    assert document.version == 1
    assert document.failed == {"only-a": "only-a.gguf: no such file"}
    assert lifecycle.resident == {"base", "both"}
    assert not asyncio.run(document.apply(encode(wanted, 1), 1))  # the periodic check
    assert lifecycle.calls == [("load", "both"), ("load", "only-a")]  # once each
    lifecycle.missing.clear()  # the file arrived; the next version names it again
    assert asyncio.run(document.apply(encode(wanted, 2), 2))
    assert document.failed == {}
    assert lifecycle.resident == {"base", "both", "only-a"}


def test_an_older_version_never_applies_and_removed_models_are_forgotten():
    lifecycle = FakeLifecycle()
    document = _document(lifecycle)
    one = ModelsSnapshot({"m": _entry("m")}, frozenset({"m"}), "base")
    assert asyncio.run(document.apply(encode(one, 5), 5))
    assert not asyncio.run(document.apply(encode(ModelsSnapshot(), 4), 4))
    assert "m" in lifecycle.sources
    assert asyncio.run(document.apply(encode(ModelsSnapshot(default="base"), 6), 6))
    assert "m" not in lifecycle.sources
    assert decode(document.sealed(), 6) == ModelsSnapshot({}, frozenset(), "base")


def test_a_change_published_here_keeps_the_models_that_failed_here():
    lifecycle = FakeLifecycle(missing={"only-a"})
    document = _document(lifecycle)
    wanted = ModelsSnapshot({"only-a": _entry("only-a")}, frozenset({"only-a"}), "base")
    asyncio.run(document.apply(encode(wanted, 1), 1))
    lifecycle.sources["mine"] = "admin"
    lifecycle.resident.add("mine")
    document.entries["mine"] = _entry("mine")
    assert document.snapshot() == ModelsSnapshot(
        {"only-a": _entry("only-a"), "mine": _entry("mine")}, frozenset({"only-a", "mine"}), "base"
    )


@dataclass
class FakeDocumentSync:
    """`DocumentSync.publish` as compare and set over one held version and blob."""

    version: int = 0
    blob: bytes | None = None
    redis_up: bool = True

    def status(self) -> SyncStatus:
        return SyncStatus(self.version, self.redis_up, None, None, 0, 0, 0)

    async def publish(self, blob: bytes, base_version: int, version: int) -> Newer | None:
        if self.version > base_version:
            return Newer(self.version, self.blob)
        self.version, self.blob = version, blob
        return None


def _run_load(sync: ModelSync, lifecycle: FakeLifecycle, model_id: str) -> LifecycleResult:
    entry = ManifestEntry.model_validate(_entry(model_id))
    return asyncio.run(sync.run(lambda: lifecycle.load(entry), entry))


def test_a_change_is_made_then_published_and_rebased_on_a_newer_version():
    lifecycle = FakeLifecycle()
    document = _document(lifecycle)
    other = ModelsSnapshot({"theirs": _entry("theirs")}, frozenset({"theirs"}), "base")
    cluster = FakeDocumentSync(version=1, blob=encode(other, 1))
    sync = ModelSync(document, cluster)  # type: ignore[arg-type]
    assert _run_load(sync, lifecycle, "mine").model_id == "mine"
    assert cluster.version == document.version == 2
    published = decode(cluster.blob or b"", 2)
    assert set(published.entries) == {"theirs", "mine"}
    assert published.loaded == {"theirs", "mine"}
    assert ("forget", "mine") not in lifecycle.calls  # the rebase kept the change


def test_a_change_is_refused_while_redis_is_down():
    lifecycle = FakeLifecycle()
    sync = ModelSync(_document(lifecycle), FakeDocumentSync(redis_up=False))  # type: ignore[arg-type]
    with pytest.raises(ServiceUnavailable, match="Redis cannot be reached"):
        _run_load(sync, lifecycle, "mine")
    assert lifecycle.calls == []
