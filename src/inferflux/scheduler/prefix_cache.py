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
from dataclasses import dataclass, field

import msgspec

from inferflux.scheduler.parking import common_prefix


@dataclass(slots=True, eq=False)
class _Node:
    """A radix tree node: the edge from its parent (`tokens`), and the cache slots whose
    sequence runs through the end of this edge."""

    tokens: list[int]
    children: dict[int, _Node] = field(default_factory=dict)
    slots: set[int] = field(default_factory=set)


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
        self._roots: dict[str, _Node] = {}
        self._entries: dict[int, _Entry] = {}
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
        ordered = sorted(self._entries.items(), key=lambda item: item[1].last_used)
        return [(slot, e.namespace, list(e.tokens)) for slot, e in ordered]

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
        self._touch(entry)
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
        node = self._roots.get(namespace)
        matched = 0
        deepest: _Node | None = None  # the last node the tokens reach into
        limit = min(len(tokens), max_length)
        while node is not None and matched < limit:
            child = node.children.get(tokens[matched])
            if child is None:
                break
            n = _common_length(child.tokens, tokens, matched, limit)
            matched += n
            deepest = child
            if n < len(child.tokens):
                break
            node = child
        # the most recent entry only where it is asked: a node near the root (a shared
        # system prompt) holds every entry
        return None if deepest is None else Match(self._most_recent(deepest.slots), matched)

    def _most_recent(self, slots: set[int]) -> int:
        return max(slots, key=lambda s: self._entries[s].last_used)

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
            self._touch(self._entries[covering.slot])  # already cached (maybe longer)
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
        """A slot of `namespace` whose whole sequence is a prefix of `tokens`."""
        for slot, entry in self._entries.items():
            n = len(entry.tokens)
            if (
                entry.namespace == namespace
                and n <= len(tokens)
                and (n == 0 or entry.tokens[-1] == tokens[n - 1])  # cheap: most differ there
                and tokens[:n] == entry.tokens
            ):
                return slot
        return None

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
        candidates = [
            s
            for s, e in self._entries.items()
            if s not in exclude and (namespace is None or e.namespace == namespace)
        ]
        return min(candidates, key=lambda s: self._entries[s].last_used) if candidates else None

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
        self._entries[slot] = _Entry(namespace, list(tokens), self._clock)
        node = self._roots.setdefault(namespace, _Node(tokens=[]))
        i = 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                child = node.children[tokens[i]] = _Node(tokens=tokens[i:])
                child.slots.add(slot)
                return
            n = _common_length(child.tokens, tokens, i, len(tokens))
            if n < len(child.tokens):
                child = _split(node, child, n)
            child.slots.add(slot)
            i += n
            node = child

    def _remove(self, slot: int) -> None:
        entry = self._entries.pop(slot)
        self._num_tokens -= len(entry.tokens)
        root = self._roots[entry.namespace]
        path: list[tuple[_Node, _Node]] = []
        node, i = root, 0
        while i < len(entry.tokens):
            child = node.children[entry.tokens[i]]
            child.slots.discard(slot)
            path.append((node, child))
            i += len(child.tokens)
            node = child
        for parent, child in reversed(path):
            if not child.slots:
                del parent.children[child.tokens[0]]
            elif len(child.children) == 1 and child.slots == _only(child).slots:
                _merge(parent, child)
        if not root.children:
            del self._roots[entry.namespace]

    def _touch(self, entry: _Entry) -> None:
        self._clock += 1
        entry.last_used = self._clock

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
            {ns: _shape(root) for ns, root in self._roots.items()},
            msgspec.structs.asdict(self.stats),
        )


def _common_length(edge: list[int], tokens: list[int], start: int, limit: int) -> int:
    """How many of `edge` equal `tokens[start:limit]`'s first ones (C-speed slices)."""
    return common_prefix(edge, tokens, limit - start, start)


def _split(parent: _Node, child: _Node, n: int) -> _Node:
    """Cut `child`'s edge after `n` tokens; returns the new middle node."""
    middle = _Node(tokens=child.tokens[:n], slots=set(child.slots))
    child.tokens = child.tokens[n:]
    middle.children[child.tokens[0]] = child
    parent.children[middle.tokens[0]] = middle
    return middle


def _only(node: _Node) -> _Node:
    return next(iter(node.children.values()))


def _merge(parent: _Node, child: _Node) -> None:
    """Fold `child`'s single child into it (they carry the same slots)."""
    grandchild = _only(child)
    merged = _Node(tokens=child.tokens + grandchild.tokens, slots=grandchild.slots)
    merged.children = grandchild.children
    parent.children[merged.tokens[0]] = merged


def _shape(node: _Node) -> tuple[object, ...]:
    return (
        tuple(node.tokens),
        tuple(sorted(node.slots)),
        tuple(_shape(c) for _, c in sorted(node.children.items())),
    )
