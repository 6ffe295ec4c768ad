"""The radix tree of slots that parked prefixes and the prefix cache keep their
sequences in (scheduler/slot_tree.py), against brute-force answers over the same
sequences. Pure logic."""

from __future__ import annotations

from hypothesis import given, settings

from inferflux.scheduler.slot_tree import SlotTree
from tests.unit.scheduler.test_prefix_cache import operations

# the prefix cache's random (op, namespace, tokens, slot): "insert" adds `tokens` for
# `slot`, "match" asks about `tokens`, "remove" takes `slot` out


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def check_answers(
    tree: SlotTree, held: dict[int, tuple[str, list[int]]], namespace: str, tokens: list[int]
) -> None:
    mine = {s: t for s, (ns, t) in held.items() if ns == namespace}
    for limit in (len(tokens), 3, 1):
        for among in ([0, 1, 2, 3], [1, 3], []):
            lengths = {s: min(shared(t, tokens), limit) for s, t in mine.items() if s in among}
            best = max(lengths.values(), default=0)
            lowest = min((s for s, n in lengths.items() if n == best), default=None)
            expected = None if best == 0 or lowest is None else (lowest, best)
            assert tree.longest(namespace, tokens, limit, among) == expected
    prefixes = {s: len(t) for s, t in mine.items() if tokens[: len(t)] == t}
    deepest = max(prefixes.values(), default=0)
    expected_prefix = min((s for s, n in prefixes.items() if n == deepest), default=None)
    assert tree.prefix_of(namespace, tokens) == expected_prefix


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_tree_answers_as_comparing_every_sequence_would(ops: list) -> None:  # type: ignore[type-arg]
    tree = SlotTree()
    held: dict[int, tuple[str, list[int]]] = {}
    for op, namespace, tokens, slot in ops:
        if op == "insert" and slot not in held:
            tree.add(namespace, slot, tokens)
            held[slot] = (namespace, tokens)
        elif op == "remove" and slot in held:
            tree.remove(held[slot][0], slot, held.pop(slot)[1])
        else:
            check_answers(tree, held, namespace, tokens)
    # what removals leave is the tree the remaining sequences alone make
    fresh = SlotTree()
    for slot, (namespace, tokens) in held.items():
        fresh.add(namespace, slot, tokens)
    assert tree.shape() == fresh.shape()


def test_a_walk_reports_the_tokens_matched_through_each_node() -> None:
    tree = SlotTree()
    tree.add("", 0, [1, 2, 3, 4])
    tree.add("", 1, [1, 2, 9])
    path = tree.walk("", [1, 2, 3, 7], 10)
    assert [(sorted(node.slots), matched) for node, matched in path] == [([0, 1], 2), ([0], 3)]
    assert tree.walk("", [1, 2, 3, 7], 1)[-1][1] == 1  # cut at the limit
    assert tree.walk("other", [1, 2], 10) == []
    assert tree.longest("", [1, 2, 3, 7], 10, [1]) == (1, 2)  # slot 0 is not among them
    assert tree.prefix_of("", [1, 2, 9, 9]) == 1 and tree.prefix_of("", [1, 2]) is None
