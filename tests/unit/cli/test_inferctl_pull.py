"""`inferctl pull` helpers: spec parsing, streamed SHA-256, the models manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import typer
import yaml

from inferflux.cli.inferctl.pull import file_sha256, models_dir, parse_spec, update_manifest


def test_parse_spec() -> None:
    assert parse_spec("acme/tiny-GGUF") == ("acme/tiny-GGUF", None)
    assert parse_spec("acme/tiny-GGUF:q8/x.gguf") == ("acme/tiny-GGUF", "q8/x.gguf")
    for bad in ("tiny", "a/b/c", "/x:y.gguf"):
        with pytest.raises(typer.Exit) as info:
            parse_spec(bad)
        assert info.value.exit_code == 2


def test_file_sha256_spans_several_blocks(tmp_path: Path) -> None:
    data = bytes(range(256)) * 9000  # > 2 MiB
    path = tmp_path / "x.gguf"
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()


def test_the_manifest_appends_and_replaces_by_id(tmp_path: Path) -> None:
    manifest = tmp_path / "models" / "models.yaml"
    first = {"id": "a", "path": "/m/a.gguf", "sha256": "1" * 64, "source": "hf://o/r/a.gguf@x"}
    second = {**first, "id": "b", "path": "/m/b.gguf"}
    update_manifest(manifest, first)
    update_manifest(manifest, second)
    update_manifest(manifest, {**first, "sha256": "2" * 64})
    entries = yaml.safe_load(manifest.read_text())
    assert [e["id"] for e in entries] == ["b", "a"]
    assert entries[1]["sha256"] == "2" * 64


def test_models_dir_prefers_dest_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERFLUX_MODELS_DIR", "/env/models")
    assert models_dir(Path("/d")) == Path("/d")
    assert models_dir(None) == Path("/env/models")
    monkeypatch.delenv("INFERFLUX_MODELS_DIR")
    monkeypatch.setenv("HOME", "/home/u")
    assert models_dir(None) == Path("/home/u/.cache/inferflux/models")


def test_update_manifest_keeps_the_mapping_form(tmp_path):
    manifest = tmp_path / "models.yaml"
    manifest.write_text(
        yaml.safe_dump({"models": [{"id": "a", "path": "a.gguf", "sha256": "1" * 64}]})
    )
    update_manifest(manifest, {"id": "b", "path": "/m/b.gguf", "sha256": "2" * 64})
    data = yaml.safe_load(manifest.read_text())
    assert [e["id"] for e in data["models"]] == ["a", "b"]
