"""Carrying out a step's KV operations on the backend, and evicting the prefix cache.

Owns: turning each `KvOp` the scheduler plans (scheduler/request.py: frees, host-tier
saves, prefix-cache copies, parked prefixes moved or kept in place, lower-tier restores,
hand-off hydrations) into backend calls, in order, and what a refused one means: its
cache entry is dropped and its request computes its prompt instead. Also the eviction of
every prefix-cache entry and parked prefix (a step with no KV room, memory pressure).
Does not own: which ops a step needs (scheduler/), the tiers' storage (kv_offload.py),
the hand-off channel (kv_channel.py). Thread rule: EngineCore's thread, as for the core.
"""

from __future__ import annotations

import logging

from inferflux.engine.backends.base import ModelBackend
from inferflux.engine.kv_channel import Handoffs
from inferflux.engine.kv_offload import KvOffload
from inferflux.scheduler import RequestId, Scheduler
from inferflux.scheduler.request import (
    KvCopy,
    KvFree,
    KvHydrate,
    KvKeep,
    KvMove,
    KvOp,
    KvRestore,
    KvSave,
)

logger = logging.getLogger(__name__)


class KvApplier:
    """The backend side of the scheduler's KV bookkeeping (EngineCore's `kv`)."""

    def __init__(
        self,
        backend: ModelBackend,
        scheduler: Scheduler,
        kv_offload: KvOffload | None,
        handoffs: Handoffs | None,
    ) -> None:
        self.backend = backend
        self.scheduler = scheduler
        self.kv_offload = kv_offload
        self.handoffs = handoffs

    def apply(self, ops: list[KvOp]) -> set[RequestId]:
        """Run the scheduler's KV copies and frees in order. A cache hit whose copy
        llama.cpp refuses (a window-sized SWA cache may not keep the positions a prefix
        needs) is not an error: the entry is dropped and the request computes its prompt
        from the start, from the next step on. Returns those requests (this step's chunks
        of theirs assumed the copied KV)."""
        recompute: set[RequestId] = set()
        if self.kv_offload is not None:
            self.kv_offload.spill_pending()  # evicted entries, before their slots change
        for op in ops:
            if isinstance(op, KvFree | KvSave):
                self._free_or_save(op)
                continue
            if isinstance(op, KvRestore | KvHydrate):
                done = self._load_kv(op)  # logged why not
            elif isinstance(op, KvMove):  # a parked prefix, where no gap is left
                done = self._move_kv(op)
            elif isinstance(op, KvKeep):  # a parked prefix continued in place
                done = self.backend.keep_seq(op.seq_id, op.n_tokens)
                if not done:
                    logger.warning(
                        "reusing the parked prefix of %s failed; computing its prompt instead",
                        op.request.request_id,
                    )
                    self.backend.free_seq(op.seq_id)
            else:
                done = self._copy_kv(op)
            if not done and op.request is not None:
                self.scheduler.cache_copy_failed(op.request)
                recompute.add(op.request.request_id)
        return recompute

    def _free_or_save(self, op: KvFree | KvSave) -> None:
        if isinstance(op, KvFree):
            self.backend.free_seq(op.seq_id)
        elif self.kv_offload is not None:
            self.kv_offload.save_parked(op.seq_id, op.namespace, op.token_ids)

    def _move_kv(self, op: KvMove) -> bool:
        """Serialize the prefix parked in `op.src` into `op.dst` (cut to `op.n_tokens`):
        costs what its tokens hold, where a copy across KV streams moves every cell."""
        moved = self.backend.load_seq(op.dst, self.backend.save_seq(op.src), op.n_tokens)
        if not moved:
            logger.warning("moving the parked prefix of %s failed", op.request.request_id)
        return moved

    def _copy_kv(self, op: KvCopy) -> bool:
        """A prefix-cache copy (a hit's, or an insert's); a refused one drops its entry."""
        if self.backend.copy_seq(op.src, op.dst, op.n_tokens):
            return True
        cache = self.scheduler.prefix_cache
        if op.request is not None:
            logger.warning(
                "prefix-cache copy into %s failed; computing its prompt instead",
                op.request.request_id,
            )
            self.backend.free_seq(op.dst)
            if cache is not None:
                cache.remove(op.src)
        elif cache is not None:
            cache.remove(op.dst)
        return False

    def _load_kv(self, op: KvRestore | KvHydrate) -> bool:
        """Load a lower-tier cache entry or a hand-off ticket into the op's sequence."""
        if isinstance(op, KvRestore):
            tokens = op.request.prompt_token_ids + op.request.output_token_ids
            return self.kv_offload is not None and self.kv_offload.restore(
                op.key, op.dst, op.n_tokens, op.request.cache_namespace, tokens
            )
        request = op.request
        if self.handoffs is None:
            return False
        ticket = self.handoffs.hydrate(
            request.request_id,
            op.dst,
            request.prompt_token_ids[: op.n_tokens],
            request.cache_namespace,
        )
        if ticket is None:
            return False
        request.num_cached_tokens = ticket.num_cached_tokens  # the prefill worker's hit
        return True

    def evict_prefix_cache(self, *, spill: bool = True) -> bool:
        """Free the KV of every prefix-cache entry, saving them to the host tier first
        when there is one and `spill`; False if there was none."""
        cache = self.scheduler.prefix_cache
        parked = self.scheduler.drop_parked()
        for slot in parked:
            self.backend.free_seq(slot)
        if cache is None or not cache.num_entries:
            return bool(parked)
        slots = cache.evict_all()
        if self.kv_offload is not None:
            if spill:
                self.kv_offload.spill_pending()  # before the slots are freed
            else:
                self.kv_offload.drop_pending()
        for slot in slots:
            self.backend.free_seq(slot)
        return True
