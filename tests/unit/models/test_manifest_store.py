"""ManifestStore on real files: each change an atomic rewrite that keeps the file's form,
its other keys and the exact fields (signatures) of untouched entries."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inferflux.config.manifest import ManifestEntry, read_manifest
from inferflux.errors import ConfigError
from inferflux.models.manifest_store import ManifestStore

SHA = "ab" * 32


def entry(model_id: str, **fields: object) -> ManifestEntry:
    return ManifestEntry.model_validate(
        {"id": model_id, "path": f"{model_id}.gguf", "sha256": SHA, **fields}
    )


def raw(model_id: str, **fields: object) -> dict[str, object]:
    return {"id": model_id, "path": f"{model_id}.gguf", "sha256": SHA, **fields}


def write(path: Path, data: object) -> ManifestStore:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return ManifestStore(path)


def load(path: Path) -> object:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_upsert_adds_and_replaces_keeping_the_list_form(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    signed = raw("a", default=True, signature="c2ln", n_ctx=512)
    store = write(path, [signed])
    written = store.upsert(entry("b", aliases=("bee",), system="Be brief."))
    assert [e.id for e in written.models] == ["a", "b"]
    data = load(path)
    assert isinstance(data, list) and data[0] == signed  # untouched, signature and all
    assert data[1] == raw("b", aliases=["bee"], system="Be brief.")
    store.upsert(entry("b", n_ctx=1024))
    assert load(path)[1] == raw("b", n_ctx=1024)
    assert read_manifest(path).models[1].n_ctx == 1024
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models.yaml"]  # no temp file left


def test_the_mapping_form_and_its_order_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "manifest.yaml"
    store = write(path, {"models": [raw("a", default=True), raw("b")]})
    store.remove("b")
    assert load(path) == {"models": [raw("a", default=True)]}
    assert store.remove("b") is None  # nothing to remove: nothing written


def test_set_default_moves_the_flag_and_swap_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "manifest.yaml"
    store = write(path, {"models": [raw("a", default=True), raw("b")]})
    written = store.set_default("b")
    assert written is not None and written.default_id() == "b"
    assert load(path) == {"models": [raw("a"), raw("b", default=True)]}
    store.upsert(entry("b", n_ctx=256))  # a swap's entry without `default`: still the default
    assert read_manifest(path).default_id() == "b"
    store.upsert(entry("c", default=True))
    assert read_manifest(path).default_id() == "c"
    assert [bool(item.get("default")) for item in load(path)["models"]] == [False, False, True]


def test_a_signed_entry_keeps_its_default_flag(tmp_path: Path, caplog) -> None:
    path = tmp_path / "manifest.yaml"
    store = write(path, [raw("a", default=True, signature="c2ln"), raw("b")])
    before = path.read_text(encoding="utf-8")
    assert store.set_default("b") is None
    assert path.read_text(encoding="utf-8") == before
    assert "re-sign" in caplog.text
    store.upsert(entry("c", default=True))  # written without the flag: one default stays
    manifest = read_manifest(path)
    assert manifest.default_id() == "a" and not manifest.models[2].default


def test_a_broken_manifest_is_never_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "manifest.yaml"
    path.write_text("models: [{id: a}]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="path"):
        ManifestStore(path).upsert(entry("b"))
    assert path.read_text(encoding="utf-8") == "models: [{id: a}]\n"
