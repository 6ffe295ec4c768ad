"""The disk tier under write failures: real files in a tmp folder whose `blobs` folder is
swapped for a plain file (every write then fails with ENOTDIR, as on a full or
read-only disk, without needing root); the sequence state comes from FakeKvBackend."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from inferflux.engine.kv_disk import DiskBlobs
from inferflux.engine.kv_offload import KvOffload, OffloadConfig
from inferflux.engine.kv_tiers import KvTierStore
from tests.unit.engine.test_kv_offload import LAYOUT, FakeKvBackend


def _offload(folder: Path) -> tuple[KvOffload, DiskBlobs]:
    disk = DiskBlobs(folder, workers=2, queue_depth=8)
    store = KvTierStore(host_max_bytes=0, disk_max_bytes=1_000_000, disk=disk, min_match=4)
    config = OffloadConfig(model_id="m", layout=LAYOUT, persist=True)
    return KvOffload(FakeKvBackend(), store, config, disk), disk


def _spill(offload: KvOffload, seq: int, n: int) -> None:
    backend = offload.backend
    assert isinstance(backend, FakeKvBackend)
    backend.seqs[seq] = n
    offload.on_evict(seq, "t", [seq, *range(n - 1)])
    offload.spill_pending()


def _break(disk: DiskBlobs) -> None:
    shutil.rmtree(disk.blobs)
    disk.blobs.write_bytes(b"not a folder")


def _mend(disk: DiskBlobs) -> None:
    disk.blobs.unlink()
    disk.blobs.mkdir()


def test_failed_writes_drop_their_entries_count_and_log_once(tmp_path, caplog) -> None:
    offload, disk = _offload(tmp_path / "kv")
    _break(disk)
    with caplog.at_level(logging.WARNING, logger="inferflux.engine.kv_disk"):
        for seq in range(1, 6):
            _spill(offload, seq, 20)
        disk.flush()
        offload.tick(None)
    s = offload.stats
    assert (s.write_errors, s.disk_entries, s.disk_bytes) == (5, 0, 0)
    assert not list(tmp_path.glob("kv/**/*.kv")) and not list(tmp_path.glob("kv/**/*.tmp*"))
    assert len([r for r in caplog.records if "fail" in r.getMessage()]) == 1
    assert offload.write_snapshot(final=False, cache=None) == 0  # nothing written to name
    caplog.clear()
    _mend(disk)
    with caplog.at_level(logging.WARNING, logger="inferflux.engine.kv_disk"):
        _spill(offload, 7, 20)
        disk.flush()
        offload.tick(None)
    assert "succeed again (5 failed)" in caplog.text
    assert offload.stats.disk_entries == 1 and offload.stats.write_errors == 5
    hit = offload.match("t", [7, *range(30)], max_length=30, have=0)
    assert hit is not None and offload.restore(hit.key, 0, hit.length)


def test_a_manifest_the_disk_refuses_keeps_the_previous_one(tmp_path, caplog) -> None:
    offload, disk = _offload(tmp_path / "kv")
    _spill(offload, 1, 20)
    disk.flush()
    assert offload.write_snapshot(final=False, cache=None) == 1
    manifest = (disk.folder / "manifest.msgpack").read_bytes()
    (disk.folder / "manifest.msgpack.tmp").mkdir()  # the temp file cannot be created
    with caplog.at_level(logging.WARNING, logger="inferflux.engine.kv_offload"):
        for _ in range(3):  # logged once, not raised
            assert offload.write_snapshot(final=False, cache=None) == 0
        assert offload.write_snapshot(final=True, cache=None) == 0
    assert caplog.text.count("cannot write the manifest") == 1
    assert (disk.folder / "manifest.msgpack").read_bytes() == manifest
    (disk.folder / "manifest.msgpack.tmp").rmdir()
    assert offload.write_snapshot(final=False, cache=None) == 1


@pytest.mark.parametrize("cut", [1, 200])
def test_a_truncated_blob_is_refused_on_restore(tmp_path, cut) -> None:
    offload, disk = _offload(tmp_path / "kv")
    _spill(offload, 1, 20)
    disk.flush()
    (path,) = disk.blobs.glob("*.kv")
    path.write_bytes(path.read_bytes()[:-cut])
    hit = offload.match("t", [1, *range(30)], max_length=30, have=0)
    assert hit is not None and not offload.restore(hit.key, 0, hit.length)
    assert offload.stats.refusals == 1 and offload.stats.disk_entries == 0
