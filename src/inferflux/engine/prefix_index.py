"""`PrefixIndex`: the API process's guess of which worker holds which prompt prefix.

Owns: chained hashes of fixed blocks of tokens (`block_hashes`), and per worker a bounded
LRU set of the block hashes recently routed there. Pure logic, no I/O. Does not own the
workers' real prefix caches (scheduler/prefix_cache.py): this index only remembers what
was sent where, so it can be wrong (a worker evicted an entry, or never cached it), and
routing treats its answers as hints.

Why chained block hashes: block i's hash covers the namespace and every token before the
end of block i, so one dict lookup per block tells whether a worker saw that whole prefix
(SGLang's router and llm-d's endpoint picker approximate their workers' caches the same
way). The namespace (tenant / adapter) seeds the chain, so a prefix matches only within
its namespace, as the workers' caches do. Python's `hash` is enough: the index lives and
dies with this process, and a rare collision costs one cache miss, never a wrong answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

BLOCK_TOKENS = 16  # tokens per hashed block; a partial last block is not indexed


def block_hashes(
    namespace: str, token_ids: Sequence[int], *, prefix: Sequence[int] = ()
) -> list[int]:
    """The chained hashes of the full `BLOCK_TOKENS` blocks of `token_ids`. `prefix`:
    hashes already computed for the first blocks of these same tokens (they are kept and
    the chain goes on from them)."""
    hashes = list(prefix)
    chain = hashes[-1] if hashes else hash(("inferflux-prefix", namespace))
    for start in range(len(hashes) * BLOCK_TOKENS, len(token_ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        chain = hash((chain, *token_ids[start : start + BLOCK_TOKENS]))
        hashes.append(chain)
    return hashes


class PrefixIndex:
    """Per worker, an LRU set of chained block hashes, at most `capacity` blocks each.

    NOTE: `insert` touches a prompt's blocks last to first, so a prompt's first blocks are
    always more recent than its later ones and eviction removes the deepest blocks first,
    as a radix tree evicts leaves: what stays of a prefix is still a prefix.
    Not thread-safe: the engine client calls it from the event loop only.
    """

    def __init__(self) -> None:
        self._blocks: dict[int, OrderedDict[int, None]] = {}

    def match(self, worker_id: int, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` `worker_id` is known to hold. No side effect."""
        blocks = self._blocks.get(worker_id)
        if not blocks:
            return 0
        n = 0
        for value in hashes:
            if value not in blocks:
                break
            n += 1
        return n

    def insert(self, worker_id: int, hashes: Sequence[int], *, capacity: int) -> None:
        """Remember that `worker_id` holds these blocks (most recent first), then evict its
        least recently used blocks above `capacity`."""
        blocks = self._blocks.setdefault(worker_id, OrderedDict())
        for value in reversed(hashes):
            blocks[value] = None
            blocks.move_to_end(value)
        while len(blocks) > max(capacity, 0):
            blocks.popitem(last=False)

    def forget(self, worker_id: int) -> None:
        """Drop everything known of `worker_id` (it restarted, or it is gone)."""
        self._blocks.pop(worker_id, None)

    def retain(self, worker_ids: Iterable[int]) -> None:
        """Forget every worker not in `worker_ids`."""
        keep = set(worker_ids)
        for worker_id in [w for w in self._blocks if w not in keep]:
            del self._blocks[worker_id]

    def num_blocks(self, worker_id: int) -> int:
        blocks = self._blocks.get(worker_id)
        return len(blocks) if blocks is not None else 0
