"""The disk tier's files: blob writes on a small thread pool, and the snapshot manifest.

Owns: one folder per (model, worker) under `runtime.nvme_offload.path`, holding
`blobs/<key>.kv` and `manifest.msgpack`. Writes go to a temp file and are renamed into
place, on `workers` threads with at most `queue_depth` in flight (`write` refuses
beyond that rather than wait), so the engine step never waits on disk. Does not own:
which blobs to keep (kv_tiers.py) or their format (kv_state.py).

The manifest is the snapshot: the index of entries whose blobs were completely written,
written last, atomically (temp file, fsync, rename). A crash at any point leaves the
previous manifest in place; entries it names whose files are gone are skipped at load,
a torn or corrupt blob is refused by its checksum when restored, and files no manifest
names (or `.tmp` leftovers) are deleted at start-up.

A write that fails (disk full, read-only, I/O error) leaves nothing behind (its temp
file is removed; a blob appears only by rename once completely written): it is counted
(`write_errors`), its key is handed to the tier index (`take_failed`) which forgets the
entry, and only the first failure of a run of them (at most one a minute), and the first
success after it, are logged: a full disk must not flood the log. Writes simply succeed
again once the disk does: there is no state to reset. A delete that fails is retried
after the next write that succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from inferflux.engine.kv_state import PREFIX_SIZE, KvStateRefused, header_end

logger = logging.getLogger(__name__)

MANIFEST = "manifest.msgpack"
_LOG_EVERY_S = 60.0  # at most one "writes fail" line per minute
_MANIFEST_VERSION = 1


class ManifestEntry(msgspec.Struct, array_like=True):
    key: str
    namespace: str
    token_ids: list[int]
    nbytes: int
    last_used: int


class Manifest(msgspec.Struct, kw_only=True):
    version: int = _MANIFEST_VERSION
    model_id: str
    layout: dict[str, int | bool | str]
    written_at: float
    entries: list[ManifestEntry]


class DiskBlobs:
    """Blob files in `folder`, written by a bounded thread pool (implements BlobDisk)."""

    def __init__(self, folder: Path, *, workers: int, queue_depth: int) -> None:
        self.folder = folder
        self.blobs = folder / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.queue_depth = queue_depth
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kv-disk")
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._pending: dict[str, bytes] = {}
        self._deleted: set[str] = set()
        self._failed: list[str] = []  # keys whose write failed, for take_failed
        self._undeleted: set[str] = set()  # keys whose unlink failed, retried later
        self._failing = 0  # failures since the last write that succeeded
        self._failure_logged_at = -_LOG_EVERY_S
        self._logged_run = False  # this run of failures was logged
        self.write_errors = 0

    def path(self, key: str) -> Path:
        return self.blobs / f"{key}.kv"

    def write(self, key: str, data: bytes, *, block: bool = False) -> bool:
        with self._lock:
            while len(self._pending) >= self.queue_depth:
                if not block:
                    return False
                self._done.wait()
            self._pending[key] = data
            self._deleted.discard(key)
            self._undeleted.discard(key)
        self._pool.submit(self._write, key, data)
        return True

    def _write(self, key: str, data: bytes) -> None:
        target = self.path(key)
        temp = target.with_suffix(f".tmp-{threading.get_ident()}")
        error: OSError | None = None
        try:
            temp.write_bytes(data)
            os.replace(temp, target)
        except OSError as exc:
            error = exc
            with contextlib.suppress(OSError):
                temp.unlink()
        with self._lock:
            self._pending.pop(key, None)
            self._settle(key, error)
            if key in self._deleted:
                self._deleted.discard(key)
                self._unlink(key)
            self._done.notify_all()

    def _settle(self, key: str, error: OSError | None) -> None:
        """Count and log a write's outcome (the lock held). Logged: the first failure of a
        run of them (at most one such line per `_LOG_EVERY_S`), and the first success after
        a logged one."""
        if error is not None:
            self.write_errors += 1
            self._failed.append(key)
            self._failing += 1
            now = time.monotonic()
            if self._failing == 1 and now - self._failure_logged_at >= _LOG_EVERY_S:
                self._failure_logged_at, self._logged_run = now, True
                logger.warning(
                    "KV disk tier: writes to %s fail (%s); evicted entries are dropped "
                    "(counted in inferflux_kv_disk_write_errors_total, not logged) until a "
                    "write succeeds",
                    self.blobs,
                    error.strerror or error,
                )
            return
        if self._failing and self._logged_run:
            logger.warning(
                "KV disk tier: writes to %s succeed again (%d failed)", self.blobs, self._failing
            )
        self._failing, self._logged_run = 0, False
        for old in list(self._undeleted):
            self._undeleted.discard(old)
            self._unlink(old)

    def _unlink(self, key: str) -> None:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError:
            self._undeleted.add(key)

    def take_failed(self) -> list[str]:
        """The keys whose write failed since the last call (their files do not exist)."""
        with self._lock:
            failed, self._failed = self._failed, []
        return failed

    def read(self, key: str) -> bytes | None:
        with self._lock:
            data = self._pending.get(key)
        if data is not None:
            return data
        try:
            return self.path(key).read_bytes()
        except OSError:
            return None

    def read_head(self, key: str) -> bytes | None:
        """The prefix and header of blob `key` (kv_state.py), without its payload."""
        try:
            with self.path(key).open("rb") as file:
                prefix = file.read(PREFIX_SIZE)
                return prefix + file.read(header_end(prefix) - len(prefix))
        except (OSError, KvStateRefused):
            return None

    def delete(self, key: str) -> None:
        with self._lock:
            if key in self._pending:
                self._deleted.add(key)
                return
            self._unlink(key)

    def written(self, key: str) -> bool:
        with self._lock:
            return key not in self._pending

    def flush(self) -> None:
        """Wait until every write submitted so far has finished."""
        with self._lock:
            while self._pending:
                self._done.wait()

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)

    # -- the snapshot ------------------------------------------------------------------
    def write_manifest(self, manifest: Manifest) -> None:
        """Replace the manifest atomically (temp file, fsync, rename, fsync the folder).
        OSError (disk full, read-only) leaves the previous one in place."""
        target = self.folder / MANIFEST
        temp = self.folder / f"{MANIFEST}.tmp"
        try:
            with temp.open("wb") as file:
                file.write(msgspec.msgpack.encode(manifest))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp, target)
        except OSError:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_manifest(self) -> Manifest | None:
        """The last complete manifest; None when there is none or it is unreadable."""
        try:
            data = (self.folder / MANIFEST).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("KV snapshot: cannot read the manifest: %s", exc)
            return None
        try:
            return msgspec.msgpack.decode(data, type=Manifest)
        except msgspec.DecodeError as exc:
            logger.warning("KV snapshot: manifest unreadable (%s); starting empty", exc)
            return None

    def sweep(self, keep: set[str]) -> int:
        """Delete blob files not in `keep` and temp leftovers; returns how many."""
        removed = 0
        for path in list(self.blobs.iterdir()):
            if path.suffix == ".kv" and path.stem in keep:
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
        with contextlib.suppress(OSError):
            (self.folder / f"{MANIFEST}.tmp").unlink()
        return removed
