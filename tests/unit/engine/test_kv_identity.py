"""The model identity the KV tiers stamp on their blobs: host RAM alone names the files
by path, size and mtime (no hashing at start); disk tiers use the digests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferflux.engine.kv_setup import model_identity
from inferflux.errors import ModelLoadError


def test_a_host_only_identity_follows_the_files_without_reading_them(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    adapter = tmp_path / "a.gguf"
    model.write_bytes(b"x" * 100)
    adapter.write_bytes(b"y" * 10)
    first = model_identity(str(model), "", ((str(adapter), 1.0),), None)
    assert first == model_identity(str(model), "", ((str(adapter), 1.0),), None)
    assert first != model_identity(str(model), "", ((str(adapter), 0.5),), None)  # another scale
    assert first != model_identity(str(model), "", (), None)
    model.write_bytes(b"z" * 100)  # same size, new content: the mtime changes
    os.utime(model, ns=(1, 1))
    assert model_identity(str(model), "", ((str(adapter), 1.0),), None) != first


def test_a_disk_identity_is_the_content_digest(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 100)
    digest = model_identity(str(model), "", (), tmp_path / "digests")
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(b"x" * 100)
    assert model_identity(str(copy), "", (), tmp_path / "digests") == digest


def test_a_missing_model_file_is_a_load_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="cannot identify the model"):
        model_identity(str(tmp_path / "gone.gguf"), "", (), None)
