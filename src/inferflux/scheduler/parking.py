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

import itertools
from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass

from inferflux.scheduler.request import Request
from inferflux.scheduler.slot_tree import SlotTree, common_prefix

# The waiting requests whose parked prefixes an admission leaves alone (`claimed_slots`): the
# ones admitted in the same step are the first few; scanning more costs every admission
# a prefix comparison per parked slot each.
CLAIM_SCAN = 8


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
        self._tree = SlotTree()  # the parked prefixes, for `best`'s one walk

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
        self.take(slot)
        self._held[slot] = Parked(slot, namespace, list(tokens))
        self._tree.add(namespace, slot, self._held[slot].tokens)
        return True

    def best(
        self, namespace: str, tokens: list[int], *, max_length: int, free: Iterable[int]
    ) -> tuple[Parked, int] | None:
        """The parked prefix among `free` slots that `tokens` continues furthest (at most
        `max_length` tokens, at least `min_match`), with that length; ties go to the
        lowest slot, which keeps the running slots packed (docs/engine-notes.md). One
        walk down the tree of parked prefixes (slot_tree.py), not a comparison with each."""
        found = self._tree.longest(namespace, tokens, max_length, free)
        if found is None or found[1] < self.min_match:
            return None
        return self._held[found[0]], found[1]

    def take(self, slot: int) -> Parked | None:
        """Forget `slot`'s parked prefix (its slot is being used); returns it."""
        entry = self._held.pop(slot, None)
        if entry is not None:
            self._tree.remove(entry.namespace, slot, entry.tokens)
        return entry

    def entries(self) -> list[Parked]:
        return sorted(self._held.values(), key=lambda p: p.slot)

    def clear(self) -> list[int]:
        """Forget every parked prefix; returns their slots."""
        slots = sorted(self._held)
        self._held.clear()
        self._tree = SlotTree()
        return slots


def claimed_slots(
    parked: ParkedSlots, mine: list[int], waiting: Iterator[Request], free: list[int]
) -> set[int]:
    """The parked slots among `free` that one of the first `CLAIM_SCAN` of `waiting`
    (excluding the request whose tokens are `mine`) continues further than `mine`.
    Taking one displaces a prefix about to be continued: its save to the host tier lands
    after the step's admissions, so that waiting request, admitted in the same step,
    would find it in no tier (test_routing: a turn with 27 of 66 tokens cached).
    NOTE: each lookup is one walk down the tree (`best`); a per-step memo of them,
    needed while `best` compared every parked prefix, saved 1-7% after the tree came
    (bench/scheduler_cost.py, nineteenth session), so there is none."""
    found_slots = set[int]()
    for other in itertools.islice(waiting, CLAIM_SCAN):
        if not other.use_prefix_cache or other.ticket_tokens:
            continue
        tokens = other.prompt_token_ids + other.output_token_ids
        found = parked.best(other.cache_namespace, tokens, max_length=len(tokens) - 1, free=free)
        if found and found[1] > common_prefix(found[0].tokens, mine, len(mine) - 1):
            found_slots.add(found[0].slot)
    return found_slots


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
    return min(candidates, key=lambda s: (_new_runs(running, s), s != prefer, s))


def _new_runs(running: Set[int], slot: int) -> int:
    """How many runs of consecutive ids adding the free `slot` to `running` makes, less
    the runs `running` makes alone (the same for every candidate, so left out): a new
    run (+1), one extended (0), or two joined (-1). O(1), where counting the runs of
    `running | {slot}` cost a pass over every running slot per candidate."""
    return 1 - (slot - 1 in running) - (slot + 1 in running)
