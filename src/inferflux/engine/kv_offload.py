"""The prefix cache's host and disk tiers wired into the engine: spill, restore, snapshot.

Owns: serializing prefix-cache entries that llama.cpp sequences evict (`on_evict` →
`spill_pending`, on the engine thread: only the engine thread may touch the context),
answering the scheduler's lower-tier lookups with the restore rule below, loading a hit
into a request's sequence (`restore`), and the snapshot written at shutdown and loaded
at start. Does not own: budgets and LRU (kv_tiers.py), files (kv_disk.py), the blob
format (kv_state.py).

The restore rule. A lower-tier entry matching `L` tokens of a prompt whose best match in
the llama.cpp slots is `have` tokens is restored only when

    restore_overhead_s + blob_bytes × restore_s_per_byte[tier] < (L - have) × prefill_s_per_token

and `L - have` is at least the cache's `min_match`. Both rates are learned online
(exponential averages): the prefill rate from engine steps that computed at least
`_MIN_PREFILL_SAMPLE` tokens, the restore rates from every restore (read + checks +
`llama_state_seq_set_data`), starting from conservative priors (`RestoreCost`). So a
disk hit slower than recomputing is skipped (counted in `skipped`), and a restored
entry never displaces a longer match already in a slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inferflux.engine.kv_disk import DiskBlobs, Manifest, ManifestEntry
from inferflux.engine.kv_state import (
    BlobHeader,
    KvStateRefused,
    Layout,
    decode_blob,
    encode_blob,
    read_header,
)
from inferflux.engine.kv_tiers import KvTierStore, Tier, TierEntry
from inferflux.engine.messages import KvTierStats
from inferflux.scheduler.lower_tiers import LowerTierHit
from inferflux.scheduler.parking import Parked
from inferflux.scheduler.prefix_cache import PrefixCache

logger = logging.getLogger(__name__)

_MIN_PREFILL_SAMPLE = 32  # steps computing fewer tokens say little about prefill speed
_ALPHA = 0.2  # weight of a new observation in the running averages


class KvStateBackend(Protocol):
    """What the tiers need of a backend (LlamaCppBackend implements it)."""

    def save_seq(self, seq_id: int) -> bytes | memoryview: ...

    def load_seq(
        self, seq_id: int, data: bytes | bytearray | memoryview, n_tokens: int
    ) -> bool: ...

    def trim_seq(self, seq_id: int, n_tokens: int) -> bool: ...


@dataclass(slots=True)
class RestoreCost:
    """Learned costs (seconds) behind the restore rule (module docstring)."""

    prefill_s_per_token: float = 1e-3  # prior: ~1,000 tok/s, faster than any CPU here
    restore_s_per_byte: dict[str, float] = field(
        default_factory=lambda: {"host": 1 / 2e9, "disk": 1 / 2e8}
    )
    restore_overhead_s: float = 5e-4
    spill_s_per_byte: float = 0.0  # measured, reported (spills are not optional)

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        if num_tokens >= _MIN_PREFILL_SAMPLE and seconds > 0:
            self.prefill_s_per_token = _mix(self.prefill_s_per_token, seconds / num_tokens)

    def observe_restore(self, tier: str, nbytes: int, seconds: float) -> None:
        if nbytes > 0:
            self.restore_s_per_byte[tier] = _mix(self.restore_s_per_byte[tier], seconds / nbytes)

    def restore_s(self, tier: str, nbytes: int) -> float:
        return self.restore_overhead_s + nbytes * self.restore_s_per_byte[tier]

    def worth_restoring(self, tier: str, nbytes: int, gain_tokens: int) -> bool:
        return self.restore_s(tier, nbytes) < gain_tokens * self.prefill_s_per_token


def _mix(old: float, new: float) -> float:
    return (1 - _ALPHA) * old + _ALPHA * new


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    model_id: str  # the GGUF's SHA-256 (+ adapters): blobs of another model are refused
    layout: Layout
    snapshot_interval_s: float = 0.0  # 0: only at close
    persist: bool = False


class KvOffload:
    """Lower tiers of one worker's prefix cache. Engine thread only (see module doc)."""

    def __init__(
        self,
        backend: KvStateBackend,
        store: KvTierStore,
        config: OffloadConfig,
        disk: DiskBlobs | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.config = config
        self.disk = disk
        self.cost = RestoreCost()
        n_swa = config.layout.get("n_swa", 0)
        self._n_swa = n_swa if isinstance(n_swa, int) and not isinstance(n_swa, bool) else 0
        self._pending: list[tuple[int, str, list[int]]] = []
        self._last_snapshot_at = time.monotonic()
        self.spill_s_total = 0.0
        self._manifest_failing = False

    @property
    def stats(self) -> KvTierStats:
        return self.store.stats

    # -- eviction: llama.cpp slot → host tier -----------------------------------------
    def on_evict(self, slot: int, namespace: str, token_ids: list[int]) -> None:
        """PrefixCache eviction hook: remember the entry; `spill_pending` saves it before
        any KV operation can overwrite the slot."""
        self._pending.append((slot, namespace, list(token_ids)))

    def drop_pending(self) -> None:
        """Forget the entries evicted since the last call without saving them."""
        self._pending = []

    def spill_pending(self) -> None:
        """Serialize the entries evicted since the last call into the host tier. Call
        before running the scheduler's KV operations."""
        self._forget_failed_writes()
        pending, self._pending = self._pending, []
        for slot, namespace, token_ids in pending:
            self._spill(slot, namespace, token_ids)

    def save_parked(self, slot: int, namespace: str, token_ids: list[int]) -> None:
        """Serialize a parked prefix (scheduler/parking.py) into the host tier now,
        before its slot changes."""
        self._forget_failed_writes()
        # its slot may hold positions past `token_ids` (the last decode's drafts)
        if self.backend.trim_seq(slot, len(token_ids)):
            self._spill(slot, namespace, token_ids)

    def _spill(self, slot: int, namespace: str, token_ids: list[int]) -> None:
        if self.store.covers(namespace, token_ids):
            return  # already kept (a restore of it, or a longer entry)
        started = time.perf_counter()
        payload = self.backend.save_seq(slot)
        header = BlobHeader(
            model_id=self.config.model_id,
            layout=self.config.layout,
            namespace=namespace,
            token_ids=token_ids,
            created_at=time.time(),
        )
        blob = encode_blob(header, payload)
        elapsed = time.perf_counter() - started
        self.spill_s_total += elapsed
        if blob:
            self.cost.spill_s_per_byte = _mix(self.cost.spill_s_per_byte, elapsed / len(blob))
        if self.store.put(namespace, token_ids, blob) is not None:
            self.store.stats.spills += 1

    def _forget_failed_writes(self) -> None:
        """Drop the disk-tier entries whose write failed (kv_disk.py): their files do not
        exist, so they would only hold budget and miss on restore."""
        if self.disk is None:
            return
        for key in self.disk.take_failed():
            entry = self.store.entry(key)
            if entry is not None and entry.tier == "disk" and self.disk.written(key):
                self.store.remove(key)
        self.store.stats.write_errors = self.disk.write_errors

    # -- lookup and restore -------------------------------------------------------------
    def match(
        self, namespace: str, token_ids: list[int], *, max_length: int, have: int
    ) -> LowerTierHit | None:
        """Scheduler hook: a lower-tier entry to restore instead of computing, or None
        (nothing longer than `have` by `min_match`, or recomputing is cheaper)."""
        found = self.store.match(namespace, token_ids, max_length=max_length)
        if found is None or found.length - have < self.store.min_match:
            return None
        if self._n_swa and self._n_swa < found.num_entry_tokens != found.length:
            # NOTE: a restored state keeps only the last window of sliding-window layers;
            # cut shorter, the next token would lack positions (LlamaCppBackend.load_seq)
            return None
        if not self.cost.worth_restoring(found.tier, found.nbytes, found.length - have):
            self.store.stats.skipped += 1
            return None
        return LowerTierHit(key=found.key, length=found.length)

    def restore(
        self, key: str, seq_id: int, n_tokens: int, namespace: str = "", tokens: Sequence[int] = ()
    ) -> bool:
        """Load entry `key` into `seq_id`, cut to `n_tokens`. False (logged, entry
        dropped, `seq_id` empty) when the bytes are gone, refused or not loadable: the
        caller then recomputes. `tokens` (the first `n_tokens` are what the entry holds)
        find the entry that replaced `key` since the match: a longer one saved in the
        same step covers it (`KvTierStore.put`), and without this the request lost its
        whole prefix (test_routing: a turn with 0 of 66 tokens cached)."""
        entry = self.store.entry(key)
        if entry is None and len(tokens) >= n_tokens:
            found = self.store.match(namespace, list(tokens[:n_tokens]), max_length=n_tokens)
            if found is not None and found.length == n_tokens:
                key, entry = found.key, self.store.entry(found.key)
        if entry is None:
            return False
        tier: Tier = entry.tier
        started = time.perf_counter()
        data = self.store.get(key)
        try:
            if data is None:
                raise KvStateRefused("its bytes are gone")
            blob = decode_blob(data, model_id=self.config.model_id, layout=self.config.layout)
            if blob.header.token_ids != entry.token_ids or blob.header.namespace != entry.namespace:
                raise KvStateRefused("the bytes cover other tokens than the index says")
            if not self.backend.load_seq(seq_id, blob.payload, n_tokens):
                raise KvStateRefused("llama.cpp did not load the sequence state")
        except KvStateRefused as exc:
            logger.warning("KV cache entry %s (%s tier) refused: %s; recomputing", key, tier, exc)
            self.store.stats.refusals += 1
            self.store.remove(key)
            return False
        self.cost.observe_restore(tier, len(data), time.perf_counter() - started)
        stats = self.store.stats
        stats.restores += 1
        stats.restored_tokens += n_tokens
        if tier == "host":
            stats.host_hits += 1
        else:
            stats.disk_hits += 1
        return True

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """Engine hook: one step computed `num_tokens` tokens in `seconds`."""
        self.cost.observe_prefill(num_tokens, seconds)

    # -- persistence --------------------------------------------------------------------
    def tick(self, cache: PrefixCache | None) -> None:
        """Between steps: write the disk tier's index when `snapshot_interval_s` passed."""
        self._forget_failed_writes()
        interval = self.config.snapshot_interval_s
        if not self.config.persist or interval <= 0:
            return
        if time.monotonic() - self._last_snapshot_at >= interval:
            self.write_snapshot(final=False, cache=cache)

    def write_snapshot(
        self, *, final: bool, cache: PrefixCache | None, parked: Sequence[Parked] = ()
    ) -> int:
        """Write the snapshot manifest (kv_disk.py). `final` (shutdown) first serializes
        the slots' entries and the `parked` prefixes (scheduler/parking.py) and moves the
        host tier to disk, waiting for the writes; a periodic one names only what is
        completely on disk already. Returns entries named."""
        self._last_snapshot_at = time.monotonic()
        if self.disk is None:
            return 0
        if final:
            self.spill_pending()
            for slot, namespace, token_ids in cache.entries() if cache is not None else []:
                self._spill(slot, namespace, token_ids)
            for entry in parked:
                self.save_parked(entry.slot, entry.namespace, entry.tokens)
            self.store.demote_all()
            self.disk.flush()
        self._forget_failed_writes()
        entries = [
            ManifestEntry(e.key, e.namespace, e.token_ids, e.nbytes, e.last_used)
            for e in self.store.entries()
            if e.tier == "disk" and self.disk.written(e.key)
        ]
        manifest = Manifest(
            model_id=self.config.model_id,
            layout=self.config.layout,
            written_at=time.time(),
            entries=entries,
        )
        try:
            self.disk.write_manifest(manifest)
        except OSError as exc:  # disk full or read-only: the previous manifest stays
            if not self._manifest_failing:  # logged once per run of failures
                logger.warning("KV snapshot: cannot write the manifest: %s", exc)
            self._manifest_failing = True
            return 0
        if self._manifest_failing:
            logger.warning("KV snapshot: the manifest is written again")
        self._manifest_failing = False
        return len(entries)

    def load_snapshot(self) -> int:
        """Adopt the last snapshot's entries into the disk tier (each blob's header is
        checked now, its checksum at restore); delete everything else in the folder.
        Returns how many entries were adopted."""
        disk = self.disk
        if disk is None:
            return 0
        manifest = disk.read_manifest()
        adopted: set[str] = set()
        if manifest is not None and self._usable(manifest):
            for item in sorted(manifest.entries, key=lambda e: -e.last_used):
                if self._adopt(item):
                    adopted.add(item.key)
        disk.sweep(adopted)
        return len(adopted)

    def _usable(self, manifest: Manifest) -> bool:
        if manifest.model_id != self.config.model_id or manifest.layout != self.config.layout:
            logger.warning(
                "KV snapshot in %s was written for another model or KV layout; discarded",
                self.disk.folder if self.disk is not None else "?",
            )
            return False
        return True

    def _adopt(self, item: ManifestEntry) -> bool:
        assert self.disk is not None
        head = self.disk.read_head(item.key)
        try:
            if head is None:
                raise KvStateRefused("its file is missing")
            header = read_header(head)
            if header.model_id != self.config.model_id or header.token_ids != item.token_ids:
                raise KvStateRefused("its header does not match the manifest")
        except KvStateRefused as exc:
            logger.warning("KV snapshot entry %s skipped: %s", item.key, exc)
            self.store.stats.refusals += 1
            return False
        entry = TierEntry(
            item.key, item.namespace, list(item.token_ids), item.nbytes, "disk", item.last_used
        )
        return self.store.adopt(entry)

    def close(self, cache: PrefixCache | None, parked: Sequence[Parked] = ()) -> None:
        """Shutdown: the final snapshot when persistence is on, then stop the writers."""
        try:
            if self.config.persist:
                started = time.monotonic()
                n = self.write_snapshot(final=True, cache=cache, parked=parked)
                logger.info(
                    "KV snapshot: %d entries written in %.2fs", n, time.monotonic() - started
                )
        finally:
            if self.disk is not None:
                self.disk.close()
