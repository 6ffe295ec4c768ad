"""Admin changes written to the manifest (Lifecycle over a real manifest file, fake
models): load, swap, set_default, register, forget; the watcher reading the written file
back changes nothing (no reload loop); without a manifest nothing is written. The real
server and a restart are in tests/integration/test_ollama_manage.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferflux.config.manifest import ManifestEntry, read_manifest
from inferflux.config.settings import Settings
from inferflux.models.catalog import manifest_catalog
from inferflux.models.hub import ModelHub
from tests.fakes.models import FakeModelLoader

SHA = "ab" * 32


def entry(model_id: str, **fields: object) -> ManifestEntry:
    return ManifestEntry.model_validate(
        {"id": model_id, "path": f"{model_id}.gguf", "sha256": SHA, **fields}
    )


class Served:
    """A hub built from a manifest with one default model `a` (fake engines)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "manifest.yaml"
        first = {"id": "a", "path": "a.gguf", "sha256": SHA, "default": True}
        self.path.write_text(yaml.safe_dump({"models": [first]}), encoding="utf-8")
        settings = Settings.model_validate(
            {"registry": {"path": str(self.path), "max_resident_models": 3}}
        )
        catalog = manifest_catalog(settings)
        self.loader = FakeModelLoader(settings)
        self.hub = ModelHub(
            settings.registry, catalog, self.loader.slot(catalog.default), self.loader
        )

    def ids(self) -> list[str]:
        return [e.id for e in read_manifest(self.path).models]


@pytest.fixture
def served(tmp_path: Path) -> Served:
    return Served(tmp_path)


async def test_admin_changes_are_written_and_read_back_without_reloading(served: Served) -> None:
    hub = served.hub
    result = await hub.load(entry("b", aliases=("bee",), n_ctx=512))
    assert result.persisted is True and served.ids() == ["a", "b"]
    await hub.swap(entry("b", n_ctx=1024))
    await hub.set_default("b")
    registered = await hub.register(entry("c", system="Be brief.", parameters={"top_k": 5}))
    assert registered.persisted is True
    manifest = read_manifest(served.path)
    assert manifest.default_id() == "b" and manifest.models[1].n_ctx == 1024
    assert manifest.models[2].system == "Be brief." and manifest.models[2].parameters
    loads = list(served.loader.loads)
    assert loads == ["b", "b"]  # the load and the swap; `c` loads on first use
    await hub.sync_manifest(read_manifest(served.path))  # the watch reads what was written
    assert served.loader.loads == loads
    views = {v.model_id: v for v in hub.models()}
    assert views["b"].is_default and views["c"].state == "registered"
    assert views["c"].system == "Be brief."


async def test_unload_keeps_the_entry_forget_removes_it(served: Served) -> None:
    hub = served.hub
    await hub.load(entry("b"))
    unloaded = await hub.unload("b")
    assert unloaded.persisted is None and served.ids() == ["a", "b"]
    forgotten = await hub.unload("b", forget=True)
    assert forgotten.persisted is True and served.ids() == ["a"]
    assert "b" not in {v.model_id for v in hub.models() if v.state != "retiring"}


async def test_an_entry_removed_from_the_file_is_retired_whoever_added_it(
    served: Served,
) -> None:
    hub = served.hub
    await hub.load(entry("b"))
    data = yaml.safe_load(served.path.read_text(encoding="utf-8"))
    data["models"] = data["models"][:1]
    served.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    await hub.sync_manifest(read_manifest(served.path))
    assert [v.model_id for v in hub.models() if v.state != "retiring"] == ["a"]


async def test_an_operator_edit_carried_by_a_write_is_still_applied(served: Served) -> None:
    hub = served.hub
    data = yaml.safe_load(served.path.read_text(encoding="utf-8"))
    data["models"].append({"id": "x", "path": "x.gguf", "sha256": SHA})  # not applied yet
    served.path.write_text(yaml.safe_dump(data), encoding="utf-8")
    await hub.load(entry("b"))  # rewrites the file, x included
    assert served.ids() == ["a", "x", "b"] and "x" not in hub.lifecycle.applied
    await hub.sync_manifest(read_manifest(served.path))
    assert served.loader.loads == ["b", "x"]  # x loads now; b is not loaded again


async def test_a_read_older_than_a_write_is_not_applied(served: Served) -> None:
    hub = served.hub
    before = hub.lifecycle.num_writes
    stale = read_manifest(served.path)  # read, then an admin write lands
    await hub.load(entry("b"))
    lifecycle = hub.lifecycle
    assert not await lifecycle.sync_manifest(stale, unless_written_since=before)
    assert "b" in {v.model_id for v in hub.models()}  # the stale read did not undo it
    fresh = read_manifest(served.path)
    assert await lifecycle.sync_manifest(fresh, unless_written_since=lifecycle.num_writes)


async def test_entry_of_copies_file_and_settings(served: Served) -> None:
    hub = served.hub
    await hub.register(entry("b", aliases=("bee",), n_ctx=256, system="Hi."))
    copied = await hub.entry_of("bee:latest")
    assert (copied.id, copied.path, copied.n_ctx, copied.system) == ("b", "b.gguf", 256, "Hi.")
    assert copied.aliases == () and not copied.default and copied.signature is None
