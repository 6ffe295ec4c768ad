"""Settings of the prefix cache's lower tiers and its persistence (`runtime.nvme_offload`,
`runtime.paged_kv`, `runtime.kv_persistence`); docs/kv-cache.md explains them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MIB = 1024 * 1024


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class NvmeOffloadSettings(_Section):
    path: str | None = Field(
        None,
        description="Folder of the disk tier of the prefix cache (env "
        "INFERFLUX_NVME_OFFLOAD_PATH): KV evicted from host RAM is written here, one "
        "subfolder per model and worker. Unset: no disk tier (and no persistence).",
    )
    workers: int = Field(
        2, ge=1, le=64, description="Threads writing KV blobs to disk, off the engine step."
    )
    queue_depth: int = Field(
        32,
        ge=1,
        le=100_000,
        description="Disk writes in flight at most; beyond it an evicted entry is dropped "
        "instead of making the engine step wait.",
    )
    max_bytes: int = Field(
        4 * 1024 * MIB,
        ge=MIB,
        description="Byte budget of the disk tier per worker (LRU eviction above it).",
    )


class PagedKvSettings(_Section):
    cpu_pages: int = Field(
        512,
        ge=0,
        le=16 * 1024 * 1024,
        description="Host-RAM tier of the prefix cache in 1 MiB pages per worker (env "
        "INFERFLUX_KV_CPU_PAGES), filled as needed: entries evicted from llama.cpp sequences "
        "and parked prefixes a request displaces are serialized here and restored when that "
        "is cheaper than recomputing. 0 = no host tier.",
    )
    eviction: Literal["lru"] = Field(
        "lru", description="Eviction order of each tier (env INFERFLUX_KV_EVICTION)."
    )

    @property
    def host_max_bytes(self) -> int:
        return self.cpu_pages * MIB


class KvPersistenceSettings(_Section):
    enabled: bool = Field(
        False,
        description="Keep the prefix cache across restarts: at graceful shutdown (and "
        "every snapshot_interval_s for what is on disk) its entries and index are written "
        "under runtime.nvme_offload.path; a restarted worker verifies the index before it "
        "reports ready and restores entries on their first hit. Needs nvme_offload.path.",
    )
    snapshot_interval_s: float = Field(
        60.0,
        ge=0,
        le=86_400,
        description="Seconds between snapshots of the disk tier's index while serving "
        "(0 = only at shutdown).",
    )
    shutdown_budget_s: float = Field(
        10.0,
        ge=0,
        le=600,
        description="Extra time a stopping worker gets to serialize its cached KV to disk.",
    )
