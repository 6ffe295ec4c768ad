"""Finished requests' KV left in their own sequence slots, continued in place.

A finished request's KV stays in its slot (it is *parked*). A request that continues it
furthest (at least as far as the prefix cache could) is admitted into that slot and keeps
the shared positions in place (`KvKeep`): no copy. Any other request that takes a parked
slot first moves the parked prefix into the prefix cache when what it would lose is
`min_match` tokens or more (`KvCopy`), then frees it. When the parked slot would leave a
gap among the running slots, the prefix is serialized into one that does not
(`KvMove`, `packed_slot`): a gap costs every step a pass over the weights.

Owns: which free request slots still hold a finished request's KV (a *parked* prefix),
and which of them a new request continues furthest. Pure logic, like prefix_cache.py:
the scheduler turns its answers into KV operations.

Why: with per-sequence KV (`runtime.kv_unified` false, the default) llama.cpp copies a
sequence by copying its whole stream, every cell of the context, whatever the prefix's
length (bench/kv_copy_cost.py: +27 ms per copy for SmolLM2's 4,096 cells on the slow
VM, +18 ms for Gemma 3). A request that hit the prefix cache paid one copy on admission
and another when its KV went into a cache slot: two per turn of a conversation, in the
next request's TTFT. llama-server keeps a slot's KV and continues it in place; a parked
slot does the same, so the next turn of a conversation copies nothing. A parked prefix
moves into the prefix cache (one copy) only when a request takes its slot without
continuing all of it, and only when what would be lost is long enough to be worth it.

In unified mode copies are free, and a parked prefix would hold cells the admission
control does not count, so the scheduler parks only with per-sequence KV.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Parked:
    """Slot `slot` holds the KV of `tokens` (positions 0..len-1) for `namespace`."""

    slot: int
    namespace: str
    tokens: list[int]


class ParkedSlots:
    """The parked prefixes, one per free request slot at most."""

    def __init__(self, min_match: int) -> None:
        """`min_match`: a shorter common prefix is not worth continuing."""
        self.min_match = max(1, min_match)
        self._held: dict[int, Parked] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, slot: int) -> bool:
        return slot in self._held

    @property
    def num_tokens(self) -> int:
        return sum(len(p.tokens) for p in self._held.values())

    def park(self, slot: int, namespace: str, tokens: list[int]) -> bool:
        """Remember that `slot` holds `tokens`; False (nothing kept) when too short."""
        if len(tokens) < self.min_match:
            return False
        self._held[slot] = Parked(slot, namespace, list(tokens))
        return True

    def best(
        self, namespace: str, tokens: list[int], *, max_length: int, free: Iterable[int]
    ) -> tuple[Parked, int] | None:
        """The parked prefix among `free` slots that `tokens` continues furthest (at most
        `max_length` tokens, at least `min_match`), with that length; ties go to the
        lowest slot, which keeps the running slots packed (docs/engine-notes.md)."""
        found: tuple[Parked, int] | None = None
        for slot in sorted(free):
            entry = self._held.get(slot)
            if entry is None or entry.namespace != namespace:
                continue
            n = common_prefix(entry.tokens, tokens, max_length)
            if n >= self.min_match and (found is None or n > found[1]):
                found = (entry, n)
        return found

    def take(self, slot: int) -> Parked | None:
        """Forget `slot`'s parked prefix (its slot is being used); returns it."""
        return self._held.pop(slot, None)

    def entries(self) -> list[Parked]:
        return sorted(self._held.values(), key=lambda p: p.slot)

    def clear(self) -> list[int]:
        """Forget every parked prefix; returns their slots."""
        slots = sorted(self._held)
        self._held.clear()
        return slots


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens `a` and `b` share, at most `limit`. Compares slices by
    halves (C-speed list equality) rather than token by token in Python: a 4,000-token
    conversation takes a dozen slice comparisons."""
    hi = min(len(a), len(b), limit)
    if a[:hi] == b[:hi]:
        return hi
    lo = 0  # a[:lo] == b[:lo] holds; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def packed_slot(running: Set[int], free: Iterable[int], prefer: int) -> int:
    """The free slot a request should run in: the one that leaves `running` and it in the
    fewest runs of consecutive ids, `prefer` on a tie (where its prefix is parked: no
    move; else the lowest free slot), then the lowest.

    Why: with a KV stream per sequence llama.cpp cuts a batch at every break in its seq
    ids, and each piece is another pass over the weights (a 4-row step with one gap
    cost +20% on SmolLM2, +24% on Gemma 3: docs/engine-notes.md). Only `prefer`, the
    lowest free slot and the free slots next to a running one can do best."""
    free = list(free)
    candidates = {prefer, min(free)} | {s for s in free if s - 1 in running or s + 1 in running}
    return min(candidates, key=lambda s: (_runs(running | {s}), s != prefer, s))


def _runs(slots: Set[int]) -> int:
    """How many runs of consecutive ids `slots` makes."""
    return sum(1 for s in slots if s - 1 not in slots)
