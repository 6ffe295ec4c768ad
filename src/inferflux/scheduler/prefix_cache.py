"""The prefix cache index: a radix tree over token ids whose entries are KV sequence slots.

Owns: which token sequences are cached, in which cache slot, per namespace; longest-prefix
matching; LRU eviction under a slot count and a token budget; hit/miss counters; and a
byte serialization of all of that. Pure logic: it never touches llama.cpp. EngineCore
turns its answers into KV operations (`copy_seq` from a cache slot into a request's slot
on a hit, from the request's slot into a cache slot on insert).

Why copies and not shared nodes: a running request always owns a private copy of its KV
(copied on admission), so a cache entry is only read at that instant and can be evicted
at any time without corrupting anyone; there is nothing to lock. In per-sequence KV mode
a copy moves one whole stream (measured: about 8 ms for 4,096 cells of SmolLM2, the
cost of prefilling about 3 tokens); in unified mode it only shares cells.

Namespaces (model / adapter / tenant) keep one tenant's prefixes from ever serving
another's request (the CVE-2025-46570 timing side channel); each has its own tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from inferflux.scheduler.slot_tree import SlotTree

# `_most_recent` compares this many slots' recency directly; for more it walks the
# recency order from the most recent (a node near the root holds every entry)
_SCAN_SLOTS = 8


@dataclass(slots=True)
class _Entry:
    namespace: str
    tokens: list[int]
    last_used: int


@dataclass(frozen=True, slots=True)
class Match:
    """The longest cached prefix of a request: `length` tokens held by cache slot `slot`."""

    slot: int
    length: int


@dataclass(frozen=True, slots=True)
class Insertion:
    """Copy the request's first `length` tokens into cache slot `slot`; `evicted` slots
    were dropped from the index (their KV must be freed unless reused as `slot`)."""

    slot: int
    length: int
    evicted: tuple[int, ...]


class PrefixCacheStats(msgspec.Struct, kw_only=True):
    """Counters since start (OBS-1: prefix_hits/misses/matched_tokens/partial_hits)."""

    hits: int = 0
    misses: int = 0
    partial_hits: int = 0  # hits that matched less than the whole cached entry
    matched_tokens: int = 0
    evictions: int = 0
    inserts: int = 0


class _Snapshot(msgspec.Struct):
    """What `to_bytes` writes: enough to rebuild an equal index."""

    slot_ids: list[int]
    max_tokens: int
    min_match: int
    clock: int
    entries: dict[int, tuple[str, list[int], int]]
    stats: PrefixCacheStats


class PrefixCache:
    """Longest-prefix lookup over the token sequences held in `slot_ids`."""

    def __init__(
        self,
        slot_ids: list[int],
        *,
        max_tokens: int,
        min_match: int = 1,
        namespace_max_tokens: int | None = None,
    ) -> None:
        """`max_tokens`: budget of cached tokens over all entries; `min_match`: shorter
        matches count as misses (a copy would cost more than prefilling them);
        `namespace_max_tokens`: per-namespace (tenant) quota: a namespace over it
        evicts its own entries, never another's."""
        self.slot_ids = list(slot_ids)
        self.max_tokens = max_tokens
        self.min_match = max(1, min_match)
        self.namespace_max_tokens = namespace_max_tokens
        # Called with (slot, namespace, token ids) when LRU or a quota evicts an entry,
        # before its slot is freed or reused: the lower tiers save it (kv_offload.py).
        self.on_evict: Callable[[int, str, list[int]], None] | None = None
        self.stats = PrefixCacheStats()
        self._tree = SlotTree()
        self._entries: dict[int, _Entry] = {}
        # the entries' slots, least recently used first (the order of `last_used`): the
        # LRU victim and a node's most recent entry without a pass over every entry
        self._recency: dict[int, None] = {}
        self._num_tokens = 0  # of every entry (kept by _add/_remove: read at every insert)
        self._clock = 0

    # -- queries -------------------------------------------------------------------
    @property
    def num_entries(self) -> int:
        return len(self._entries)

    @property
    def cached_tokens(self) -> int:
        return self._num_tokens

    def entries(self) -> list[tuple[int, str, list[int]]]:
        """(slot, namespace, token ids) of every entry, least recently used first."""
        entries = self._entries
        return [(s, entries[s].namespace, list(entries[s].tokens)) for s in self._recency]

    def namespace_tokens(self, namespace: str) -> int:
        return sum(len(e.tokens) for e in self._entries.values() if e.namespace == namespace)

    def entry_tokens(self, slot: int) -> list[int] | None:
        entry = self._entries.get(slot)
        return list(entry.tokens) if entry is not None else None

    def match(self, namespace: str, tokens: list[int], *, max_length: int) -> Match | None:
        """The longest cached prefix of `tokens` (at most `max_length` tokens) in
        `namespace`, counted as a hit or a miss. Marks the entry recently used."""
        found = self._longest(namespace, tokens, max_length)
        if found is None or found.length < self.min_match:
            self.stats.misses += 1
            return None
        entry = self._entries[found.slot]
        self.stats.hits += 1
        self.stats.matched_tokens += found.length
        if found.length < len(entry.tokens):
            self.stats.partial_hits += 1
        self._touch(found.slot)
        return found

    def peek(self, namespace: str, tokens: list[int], *, max_length: int) -> Match | None:
        """What `match` would return, counting and touching nothing."""
        found = self._longest(namespace, tokens, max_length)
        return found if found is not None and found.length >= self.min_match else None

    def count_hit(self, length: int, entry_length: int) -> None:
        """Count a hit served outside the index (a prefix parked in a request's slot:
        scheduler/parking.py), so the counters mean what a user reads into them."""
        self.stats.hits += 1
        self.stats.matched_tokens += length
        if length < entry_length:
            self.stats.partial_hits += 1

    def _longest(self, namespace: str, tokens: list[int], max_length: int) -> Match | None:
        path = self._tree.walk(namespace, tokens, max_length)
        if not path:
            return None
        deepest, matched = path[-1]  # the last node the tokens reach into
        return Match(self._most_recent(deepest.slots), matched)

    def _most_recent(self, slots: set[int]) -> int:
        """The most recently used of `slots`. A node near the root (a shared system
        prompt) holds every entry, and the most recent of all is then the first one."""
        if len(slots) <= _SCAN_SLOTS:
            return max(slots, key=lambda s: self._entries[s].last_used)
        return next(s for s in reversed(self._recency) if s in slots)

    # -- mutations -----------------------------------------------------------------
    def insert(self, namespace: str, tokens: list[int], *, protected: int = -1) -> Insertion | None:
        """Cache `tokens` under `namespace`. Returns where to copy them, or None when they
        are already cached (or too short to be worth a slot). An entry that `tokens`
        extends is replaced in place; otherwise a free slot is used or the least recently
        used entry (never `protected`) is evicted. Then entries are evicted, LRU first,
        until the token budget holds."""
        quota = self.namespace_max_tokens
        if len(tokens) < self.min_match or len(tokens) > min(self.max_tokens, quota or len(tokens)):
            return None
        covering = self._longest(namespace, tokens, len(tokens))
        if covering is not None and covering.length == len(tokens):
            self._touch(covering.slot)  # already cached (maybe longer)
            return None
        evicted: list[int] = []
        slot = self._extended_entry(namespace, tokens)
        if slot is not None:
            self._remove(slot)
        else:
            slot = self._free_slot(protected, evicted, self._quota_scope(namespace, tokens))
            if slot is None:
                return None
        self._add(slot, namespace, tokens)
        while quota is not None and self.namespace_tokens(namespace) > quota:
            own = self._lru(exclude={slot, protected}, namespace=namespace)
            if own is None:
                break
            self._evict(own, evicted)
        while self.cached_tokens > self.max_tokens:
            victim = self._lru(exclude={slot, protected})
            if victim is None:
                break
            self._evict(victim, evicted)
        self.stats.inserts += 1
        return Insertion(slot=slot, length=len(tokens), evicted=tuple(evicted))

    def _extended_entry(self, namespace: str, tokens: list[int]) -> int | None:
        """A slot of `namespace` whose whole sequence is a prefix of `tokens` (at most one:
        `insert` never adds a prefix of an entry, and replaces an entry it extends)."""
        return self._tree.prefix_of(namespace, tokens)

    def _quota_scope(self, namespace: str, tokens: list[int]) -> str | None:
        """`namespace` when adding `tokens` takes it over its quota: its victims must be
        its own entries then."""
        quota = self.namespace_max_tokens
        if quota is None or self.namespace_tokens(namespace) + len(tokens) <= quota:
            return None
        return namespace

    def _free_slot(self, protected: int, evicted: list[int], scope: str | None) -> int | None:
        for slot in self.slot_ids:
            if slot not in self._entries:
                return slot
        victim = self._lru(exclude={protected}, namespace=scope)
        if victim is not None:
            self._evict(victim, evicted)
        return victim

    def _lru(self, exclude: set[int], namespace: str | None = None) -> int | None:
        entries = self._entries
        for slot in self._recency:
            if slot not in exclude and (namespace is None or entries[slot].namespace == namespace):
                return slot
        return None

    def _evict(self, slot: int, evicted: list[int]) -> None:
        entry = self._entries[slot]
        if self.on_evict is not None:
            self.on_evict(slot, entry.namespace, entry.tokens)
        self._remove(slot)
        evicted.append(slot)
        self.stats.evictions += 1

    def remove(self, slot: int) -> None:
        """Forget the entry in `slot` (its KV is gone)."""
        if slot in self._entries:
            self._remove(slot)

    def evict_all(self) -> list[int]:
        """Evict every entry (the eviction hook sees each); returns their slots."""
        evicted: list[int] = []
        for slot in list(self._entries):
            self._evict(slot, evicted)
        return evicted

    def clear(self) -> list[int]:
        """Forget every entry; returns their slots."""
        slots = list(self._entries)
        for slot in slots:
            self._remove(slot)
        return slots

    def _add(self, slot: int, namespace: str, tokens: list[int]) -> None:
        self._clock += 1
        self._num_tokens += len(tokens)
        entry = self._entries[slot] = _Entry(namespace, list(tokens), self._clock)
        self._recency[slot] = None
        self._tree.add(namespace, slot, entry.tokens)

    def _remove(self, slot: int) -> None:
        entry = self._entries.pop(slot)
        del self._recency[slot]
        self._num_tokens -= len(entry.tokens)
        self._tree.remove(entry.namespace, slot, entry.tokens)

    def _touch(self, slot: int) -> None:
        self._clock += 1
        self._entries[slot].last_used = self._clock
        del self._recency[slot]
        self._recency[slot] = None

    # -- persistence ---------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The whole index (not the KV itself) as msgpack."""
        snapshot = _Snapshot(
            slot_ids=self.slot_ids,
            max_tokens=self.max_tokens,
            min_match=self.min_match,
            clock=self._clock,
            entries={s: (e.namespace, e.tokens, e.last_used) for s, e in self._entries.items()},
            stats=self.stats,
        )
        return msgspec.msgpack.encode(snapshot)

    @classmethod
    def from_bytes(cls, data: bytes) -> PrefixCache:
        """Rebuild an index equal to the one `to_bytes` saw."""
        snapshot = msgspec.msgpack.decode(data, type=_Snapshot)
        cache = cls(snapshot.slot_ids, max_tokens=snapshot.max_tokens, min_match=snapshot.min_match)
        for slot, (namespace, tokens, last_used) in sorted(
            snapshot.entries.items(), key=lambda item: item[1][2]
        ):
            cache._add(slot, namespace, tokens)
            cache._entries[slot].last_used = last_used
        cache._clock = snapshot.clock
        cache.stats = snapshot.stats
        return cache

    def state(self) -> tuple[object, ...]:
        """A comparable summary (entries with recency, tree shape, counters) for tests."""
        return (
            self.slot_ids,
            self.max_tokens,
            self.min_match,
            self._clock,
            {s: (e.namespace, tuple(e.tokens), e.last_used) for s, e in self._entries.items()},
            self._tree.shape(),
            msgspec.structs.asdict(self.stats),
        )
