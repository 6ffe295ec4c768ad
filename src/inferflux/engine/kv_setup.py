"""Building a worker's prefix-cache tiers (kv_offload.py) from its settings.

Owns: whether the tiers are on, the disk folder of one (model, worker), the model
identity written into every KV blob, and loading the last snapshot before the worker
reports ready. The index is small (one header per entry, read from disk) so it loads in
well under the spec's 30 s even for thousands of entries, and loading it before
readiness means the first request after a restart already finds its prefix; the
entries' bytes are read, checked and loaded lazily, on their first hit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Protocol

from inferflux.config.kv_settings import KvPersistenceSettings, NvmeOffloadSettings, PagedKvSettings
from inferflux.engine.kv_disk import DiskBlobs
from inferflux.engine.kv_offload import KvOffload, KvStateBackend, OffloadConfig
from inferflux.engine.kv_state import Layout
from inferflux.engine.kv_tiers import KvTierStore
from inferflux.engine.model_verify import sha256_of_path
from inferflux.errors import ModelLoadError
from inferflux.scheduler.prefix_cache import PrefixCache

logger = logging.getLogger(__name__)

_DIGEST_CACHE = "model-digests.json"


class TieredBackend(KvStateBackend, Protocol):
    def kv_layout(self) -> Layout: ...


def tiers_enabled(paged_kv: PagedKvSettings, nvme: NvmeOffloadSettings) -> bool:
    return paged_kv.cpu_pages > 0 or bool(nvme.path)


def model_identity(
    model_path: str, sha256: str, adapters: tuple[tuple[str, float], ...], cache_dir: Path | None
) -> str:
    """The model's SHA-256 (hashed now when the config names none; cached in `cache_dir`
    by path, size and mtime) plus its LoRA adapters' digests and scales. Without
    `cache_dir` (a host-RAM tier alone, whose blobs never leave the engine that wrote
    them) the files' paths, sizes and mtimes stand for the digests: no hashing of a
    multi-GB file at every start."""
    try:
        return _identity(model_path, sha256, adapters, cache_dir)
    except OSError as exc:
        raise ModelLoadError(
            f"the KV cache tiers cannot identify the model ({exc}): check "
            "runtime.nvme_offload.path is a writable folder"
        ) from None


def _identity(
    model_path: str, sha256: str, adapters: tuple[tuple[str, float], ...], cache_dir: Path | None
) -> str:
    digest = sha256 or _file_digest(model_path, cache_dir)
    if not adapters:
        return digest
    parts = [digest] + [f"{_file_digest(p, cache_dir)}@{scale}" for p, scale in adapters]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _file_digest(path: str, cache_dir: Path | None) -> str:
    stat = os.stat(path)
    key = f"{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"
    if cache_dir is None:
        return hashlib.sha256(key.encode()).hexdigest()
    cache: dict[str, str] = {}
    cache_file = cache_dir / _DIGEST_CACHE
    if cache_file.exists():
        try:
            cache = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            cache = {}
    if key in cache:
        return cache[key]
    digest = sha256_of_path(Path(path))
    cache[key] = digest
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    temp = cache_file.with_suffix(f".tmp-{os.getpid()}")
    temp.write_text(json.dumps(cache))
    os.replace(temp, cache_file)
    return digest


def build_kv_offload(
    backend: TieredBackend,
    cache: PrefixCache | None,
    *,
    model_id: str,
    worker_id: int,
    paged_kv: PagedKvSettings,
    nvme: NvmeOffloadSettings,
    persistence: KvPersistenceSettings,
) -> KvOffload | None:
    """The tiers of one worker, hooked into its prefix cache, with the last snapshot
    loaded; None when no tier is configured or the prefix cache is off."""
    if cache is None or not tiers_enabled(paged_kv, nvme):
        return None
    disk: DiskBlobs | None = None
    if nvme.path:
        folder = Path(nvme.path) / f"{model_id[:16]}-w{worker_id}"
        try:
            disk = DiskBlobs(folder, workers=nvme.workers, queue_depth=nvme.queue_depth)
        except OSError as exc:
            raise ModelLoadError(
                f"runtime.nvme_offload.path: cannot use {folder} ({exc}): make it writable"
            ) from None
    store = KvTierStore(
        host_max_bytes=paged_kv.host_max_bytes,
        disk_max_bytes=nvme.max_bytes if disk is not None else 0,
        disk=disk,
        namespace_max_tokens=cache.namespace_max_tokens,
        min_match=cache.min_match,
    )
    config = OffloadConfig(
        model_id=model_id,
        layout=backend.kv_layout(),
        snapshot_interval_s=persistence.snapshot_interval_s,
        persist=persistence.enabled and disk is not None,
    )
    offload = KvOffload(backend, store, config, disk)
    cache.on_evict = offload.on_evict
    if config.persist:
        started = time.monotonic()
        n = offload.load_snapshot()
        logger.info(
            "KV snapshot: %d entries restored into the disk tier index in %.2fs",
            n,
            time.monotonic() - started,
        )
    elif disk is not None:
        disk.sweep(set())  # without persistence, an old folder's blobs are garbage
    return offload
