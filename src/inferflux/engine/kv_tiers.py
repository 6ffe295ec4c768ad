"""The lower tiers of the prefix cache: host RAM and disk, each with a hard byte budget.

Owns: which KV blobs (kv_state.py) are kept where, LRU eviction per tier (host → disk →
gone), per-namespace (tenant) token quotas, longest-prefix lookup over the kept
entries, and the tier counters. Does not own: the bytes' format (kv_state.py), the disk
I/O (`BlobDisk`: kv_disk.py, or a fake in unit tests), or when a hit is worth restoring
(kv_offload.py). Thread rule: one thread (the engine's) calls every method; the disk
writes it starts run on the disk's own threads.

Budgets are never exceeded, counting writes still in flight: a blob's bytes are counted
against the disk budget when its write is submitted, and a write the disk's bounded
queue refuses drops the entry instead of waiting (the step loop never blocks on disk).
An entry that another covers (same namespace, the other's tokens start with all of
its tokens) is redundant: `put` skips it, and a longer entry replaces the shorter ones
it covers, since restoring a longer entry and cutting it serves every shorter match.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal, Protocol

import msgspec

from inferflux.engine.messages import KvTierStats

Tier = Literal["host", "disk"]


class BlobDisk(Protocol):
    """Where the disk tier's blobs live; writes are asynchronous and bounded."""

    def write(self, key: str, data: bytes, *, block: bool = False) -> bool:
        """Start writing `data` as `key`. False (nothing written) when the write queue is
        full and not `block`."""
        ...

    def read(self, key: str) -> bytes | None:
        """The blob (also while its write is in flight); None when it is gone."""
        ...

    def delete(self, key: str) -> None: ...

    def written(self, key: str) -> bool:
        """True once `key`'s write has completed (a snapshot may name it)."""
        ...


@dataclass(slots=True, eq=False)
class TierEntry:
    key: str
    namespace: str
    token_ids: list[int]
    nbytes: int
    tier: Tier
    last_used: int
    data: bytes | None = None  # held in the host tier only


@dataclass(frozen=True, slots=True)
class TierMatch:
    """The first `length` tokens of a request are in entry `key` (in `tier`)."""

    key: str
    length: int
    tier: Tier
    nbytes: int
    num_entry_tokens: int


def entry_key(namespace: str, token_ids: list[int]) -> str:
    """The stable name of an entry (its blob file name)."""
    digest = hashlib.sha256(namespace.encode())
    digest.update(msgspec.msgpack.encode(token_ids))
    return digest.hexdigest()[:32]


@dataclass(slots=True)
class _Budget:
    host_max_bytes: int
    disk_max_bytes: int
    namespace_max_tokens: int | None = None
    used: dict[Tier, int] = field(default_factory=lambda: {"host": 0, "disk": 0})


class KvTierStore:
    """Host and disk tiers of KV blobs. Every method mutates; one thread only."""

    def __init__(
        self,
        *,
        host_max_bytes: int,
        disk_max_bytes: int = 0,
        disk: BlobDisk | None = None,
        namespace_max_tokens: int | None = None,
        min_match: int = 1,
    ) -> None:
        self._budget = _Budget(host_max_bytes, disk_max_bytes if disk else 0, namespace_max_tokens)
        self.disk = disk
        self.min_match = max(1, min_match)
        self.stats = KvTierStats(
            host_max_bytes=host_max_bytes, disk_max_bytes=self._budget.disk_max_bytes
        )
        self._entries: dict[str, TierEntry] = {}
        self._clock = 0

    # -- queries -------------------------------------------------------------------
    def bytes_in(self, tier: Tier) -> int:
        return self._budget.used[tier]

    def entries(self) -> list[TierEntry]:
        """Every entry, least recently used first (a copy of the list; do not mutate)."""
        return sorted(self._entries.values(), key=lambda e: e.last_used)

    def entry(self, key: str) -> TierEntry | None:
        return self._entries.get(key)

    def namespace_tokens(self, namespace: str) -> int:
        return sum(len(e.token_ids) for e in self._entries.values() if e.namespace == namespace)

    def covers(self, namespace: str, token_ids: list[int]) -> bool:
        """True when an entry holds all of `token_ids` (it is touched)."""
        n = len(token_ids)
        for entry in self._entries.values():
            if entry.namespace == namespace and entry.token_ids[:n] == token_ids:
                self._touch(entry)
                return True
        return False

    def match(self, namespace: str, token_ids: list[int], *, max_length: int) -> TierMatch | None:
        """The entry sharing the longest prefix with `token_ids` (at most `max_length`
        tokens, at least `min_match`); ties go to the smaller blob. Counts nothing."""
        best: TierMatch | None = None
        limit = min(len(token_ids), max_length)
        for entry in self._entries.values():
            if entry.namespace != namespace:
                continue
            n = _common_length(entry.token_ids, token_ids, limit)
            if n < self.min_match:
                continue
            if best is None or (n, -entry.nbytes) > (best.length, -best.nbytes):
                best = TierMatch(entry.key, n, entry.tier, entry.nbytes, len(entry.token_ids))
        return best

    def get(self, key: str) -> bytes | None:
        """The blob of `key`, marked recently used; None (entry dropped) when its file
        is gone."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._touch(entry)
        if entry.data is not None:
            return entry.data
        data = self.disk.read(key) if self.disk is not None else None
        if data is None:
            self.remove(key)
        return data

    # -- mutations -----------------------------------------------------------------
    def put(self, namespace: str, token_ids: list[int], data: bytes) -> str | None:
        """Keep `data` (a blob covering `token_ids`) in the host tier, demoting LRU host
        entries to disk to make room. Returns its key, or None when it is redundant or
        larger than every budget (or the namespace's quota)."""
        quota = self._budget.namespace_max_tokens
        if len(token_ids) < self.min_match or (quota is not None and len(token_ids) > quota):
            return None
        if self.covers(namespace, token_ids):
            return None
        fits_host = len(data) <= self._budget.host_max_bytes
        if not fits_host and len(data) > self._budget.disk_max_bytes:
            return None
        for covered in [e for e in self._entries.values() if _covered_by(e, namespace, token_ids)]:
            self.remove(covered.key)
        key = entry_key(namespace, token_ids)
        entry = TierEntry(key, namespace, list(token_ids), len(data), "host", 0, data)
        self._touch(entry)
        self._entries[key] = entry
        self._budget.used["host"] += len(data)
        self._enforce_quota(namespace, keep=key)
        if not fits_host:
            self._demote(entry)
        self._fit_host(keep=key)
        self._sync_sizes()
        return key if key in self._entries else None

    def adopt(self, entry: TierEntry) -> bool:
        """Take an entry already on disk (a snapshot's, at start-up). False when it does
        not fit the disk budget."""
        if (
            entry.tier != "disk"
            or self.bytes_in("disk") + entry.nbytes > self._budget.disk_max_bytes
        ):
            return False
        self._clock = max(self._clock, entry.last_used)
        self._entries[entry.key] = entry
        self._budget.used["disk"] += entry.nbytes
        self._sync_sizes()
        return True

    def remove(self, key: str) -> None:
        """Forget `key` (its disk file is deleted)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._budget.used[entry.tier] -= entry.nbytes
        if entry.tier == "disk" and self.disk is not None:
            self.disk.delete(key)
        self._sync_sizes()

    def demote_all(self) -> int:
        """Write every host entry to disk, most recently used first, waiting for the
        queue (shutdown). Returns how many went; the rest did not fit the disk budget."""
        moved = 0
        for entry in sorted(self._entries.values(), key=lambda e: -e.last_used):
            if entry.tier == "host" and self._demote(entry, block=True):
                moved += 1
        return moved

    def shed_host(self) -> int:
        """Memory pressure: move every host entry to disk without waiting (one the disk
        cannot take now, or with no disk tier, is dropped). Returns how many left RAM."""
        shed = 0
        for entry in [e for e in self._entries.values() if e.tier == "host"]:
            self._demote(entry)
            shed += 1
        return shed

    def _fit_host(self, keep: str) -> None:
        while self._budget.used["host"] > self._budget.host_max_bytes:
            victims = [e for e in self._entries.values() if e.tier == "host" and e.key != keep]
            if not victims and keep in self._entries:
                victims = [self._entries[keep]]
            if not victims:
                return
            victim = min(victims, key=lambda e: e.last_used)
            self.stats.host_evictions += 1
            self._demote(victim)

    def _demote(self, entry: TierEntry, *, block: bool = False) -> bool:
        """Move a host entry to disk (evicting LRU disk entries, never one used more
        recently than it), or drop it."""
        data, budget = entry.data, self._budget
        if self.disk is None or data is None or entry.nbytes > budget.disk_max_bytes:
            self.remove(entry.key)
            return False
        while budget.used["disk"] + entry.nbytes > budget.disk_max_bytes:
            if not self._evict_disk(older_than=entry.last_used):
                self.remove(entry.key)
                return False
        if not self.disk.write(entry.key, data, block=block):
            self.stats.dropped_writes += 1
            self.remove(entry.key)
            return False
        budget.used["host"] -= entry.nbytes
        budget.used["disk"] += entry.nbytes
        entry.tier, entry.data = "disk", None
        self._sync_sizes()
        return True

    def _evict_disk(self, older_than: int) -> bool:
        victim = min(
            (e for e in self._entries.values() if e.tier == "disk"), key=lambda e: e.last_used
        )
        if victim.last_used > older_than:
            return False
        self.stats.disk_evictions += 1
        self.remove(victim.key)
        return True

    def _enforce_quota(self, namespace: str, keep: str) -> None:
        """One tenant's entries never hold more than its quota: its own LRU entries go."""
        quota = self._budget.namespace_max_tokens
        if quota is None:
            return
        while self.namespace_tokens(namespace) > quota:
            own = [e for e in self._entries.values() if e.namespace == namespace and e.key != keep]
            if not own:
                return
            self.stats.quota_evictions += 1
            self.remove(min(own, key=lambda e: e.last_used).key)

    def _touch(self, entry: TierEntry) -> None:
        self._clock += 1
        entry.last_used = self._clock

    def _sync_sizes(self) -> None:
        s, used = self.stats, self._budget.used
        s.host_bytes, s.disk_bytes = used["host"], used["disk"]
        s.host_entries = sum(1 for e in self._entries.values() if e.tier == "host")
        s.disk_entries = len(self._entries) - s.host_entries


def _common_length(entry: list[int], tokens: list[int], limit: int) -> int:
    n = 0
    bound = min(len(entry), limit)
    while n < bound and entry[n] == tokens[n]:
        n += 1
    return n


def _covered_by(entry: TierEntry, namespace: str, token_ids: list[int]) -> bool:
    n = len(entry.token_ids)
    return entry.namespace == namespace and n <= len(token_ids) and token_ids[:n] == entry.token_ids
