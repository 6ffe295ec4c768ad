"""`SlotTree`: a radix tree over token ids whose entries are sequence slots, per namespace.

Owns: the tree shape (edges of token ids, split where two sequences part and merged back
when one goes), which slots run through each node, which end there, and the walk of a
token list down the tree. Pure logic, no policy: the prefix cache (prefix_cache.py: which
entry is most recent, what to evict) and parked slots (parking.py: which free slot a
request continues furthest) both keep their sequences in one.

Why a tree for parked slots too: a new prompt was compared with every parked prefix in
a free slot, and at 256 sequences that was 40% of the scheduler's time
(bench/scheduler_cost.py, BENCHMARKS.md, nineteenth session). One walk down the tree
finds every prefix's shared length at once: all slots under the deepest node the prompt
reaches share that many tokens with it, and those under an ancestor but not under its
child on the walk share the ancestor's depth.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Node:
    """The edge from its parent (`tokens`), the slots whose sequence runs through the end
    of this edge (`slots`), and those whose sequence ends exactly there (`ends`)."""

    tokens: list[int]
    children: dict[int, Node] = field(default_factory=dict)
    slots: set[int] = field(default_factory=set)
    ends: set[int] = field(default_factory=set)


class SlotTree:
    """Sequences of token ids, each held by a slot, per namespace (a sequence matches
    only within its namespace)."""

    def __init__(self) -> None:
        self._roots: dict[str, Node] = {}

    def add(self, namespace: str, slot: int, tokens: list[int]) -> None:
        """Insert `tokens` (not empty) for `slot`, which holds nothing in this tree yet."""
        node = self._roots.setdefault(namespace, Node(tokens=[]))
        i = 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                child = node.children[tokens[i]] = Node(tokens=tokens[i:])
                child.slots.add(slot)
                child.ends.add(slot)
                return
            n = common_prefix(child.tokens, tokens, len(tokens) - i, i)
            if n < len(child.tokens):
                child = _split(node, child, n)
            child.slots.add(slot)
            i += n
            node = child
        node.ends.add(slot)

    def remove(self, namespace: str, slot: int, tokens: list[int]) -> None:
        """Take out `slot`, which holds `tokens`; prune and merge what it leaves."""
        root = self._roots[namespace]
        path: list[tuple[Node, Node]] = []
        node, i = root, 0
        while i < len(tokens):
            child = node.children[tokens[i]]
            child.slots.discard(slot)
            path.append((node, child))
            i += len(child.tokens)
            node = child
        node.ends.discard(slot)
        for parent, child in reversed(path):
            if not child.slots:
                del parent.children[child.tokens[0]]
            elif len(child.children) == 1 and child.slots == _only(child).slots:
                _merge(parent, child)
        if not root.children:
            del self._roots[namespace]

    def walk(self, namespace: str, tokens: list[int], limit: int) -> list[tuple[Node, int]]:
        """The nodes the first `limit` of `tokens` reach into, root first, each with the
        tokens matched through it. Every slot under the last one shares exactly its
        count with `tokens` (at most `limit`); one under an earlier node but not under
        the next shares that node's count."""
        node = self._roots.get(namespace)
        path: list[tuple[Node, int]] = []
        matched = 0
        limit = min(limit, len(tokens))
        while node is not None and matched < limit:
            child = node.children.get(tokens[matched])
            if child is None:
                break
            n = common_prefix(child.tokens, tokens, limit - matched, matched)
            matched += n
            path.append((child, matched))
            if n < len(child.tokens):
                break
            node = child
        return path

    def prefix_of(self, namespace: str, tokens: list[int]) -> int | None:
        """A slot whose whole sequence is a prefix of `tokens` (the deepest; the lowest
        slot of those ending at one node)."""
        found: int | None = None
        before = 0
        for node, matched in self.walk(namespace, tokens, len(tokens)):
            if matched - before < len(node.tokens):
                break  # `tokens` part from this edge inside it: nothing ends before
            if node.ends:
                found = min(node.ends)
            before = matched
        return found

    def longest(
        self, namespace: str, tokens: list[int], limit: int, among: Iterable[int]
    ) -> tuple[int, int] | None:
        """(slot, shared length) of the slot in `among` whose sequence shares the most
        leading tokens with `tokens` (at most `limit`), the lowest slot on a tie; None
        when none of `among` shares a token."""
        path = self.walk(namespace, tokens, limit)
        if not path:
            return None
        wanted = set(among)
        for node, matched in reversed(path):
            hits = node.slots & wanted  # C-speed: iterates the smaller set
            if hits:
                return min(hits), matched
        return None

    def shape(self) -> dict[str, tuple[object, ...]]:
        """Each namespace's tree as nested tuples (tests compare them)."""
        return {namespace: _shape(root) for namespace, root in self._roots.items()}


def common_prefix(a: list[int], b: list[int], limit: int, offset: int = 0) -> int:
    """How many leading tokens `a` and `b[offset:]` share, at most `limit`. Compares
    slices (C-speed list equality) rather than token by token in Python: chunks of
    doubling size from the start while they match, then halves of the chunk that does
    not. So the cost follows the shared length, not the lists' (a parked 2,000-token
    conversation that shares only a 200-token system prompt with a prompt: 3 chunks and
    7 halvings of at most 128 tokens, where comparing the whole lists first copied all
    2,000 twice)."""
    hi = min(len(a), len(b) - offset, limit)
    lo, size = 0, 32
    while lo < hi:
        end = min(lo + size, hi)
        if a[lo:end] != b[offset + lo : offset + end]:
            hi = end
            break
        lo, size = end, size * 2
    else:
        return max(hi, 0)
    while hi - lo > 1:  # a[:lo] == b[offset:offset + lo]; a[lo:hi] differs
        mid = (lo + hi) // 2
        if a[lo:mid] == b[offset + lo : offset + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _split(parent: Node, child: Node, n: int) -> Node:
    """Cut `child`'s edge after `n` tokens; returns the new middle node (nothing ends
    there: a sequence ending at that point would have split the edge already)."""
    middle = Node(tokens=child.tokens[:n], slots=set(child.slots))
    child.tokens = child.tokens[n:]
    middle.children[child.tokens[0]] = child
    parent.children[middle.tokens[0]] = middle
    return middle


def _only(node: Node) -> Node:
    return next(iter(node.children.values()))


def _merge(parent: Node, child: Node) -> None:
    """Fold `child`'s single child into it (they carry the same slots, so nothing ends
    at `child`)."""
    grandchild = _only(child)
    merged = Node(
        tokens=child.tokens + grandchild.tokens, slots=grandchild.slots, ends=grandchild.ends
    )
    merged.children = grandchild.children
    parent.children[merged.tokens[0]] = merged


def _shape(node: Node) -> tuple[object, ...]:
    return (
        tuple(node.tokens),
        tuple(sorted(node.slots)),
        tuple(sorted(node.ends)),
        tuple(_shape(c) for _, c in sorted(node.children.items())),
    )
