"""The prefix cache index: radix-tree matching, insertion, LRU eviction, namespaces, and
the bytes round trip (pure logic; the KV copies are EngineCore's, tested on the model)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferflux.scheduler.prefix_cache import Insertion, Match, PrefixCache

SYSTEM = list(range(100, 140))  # a 40-token "system prompt"


def test_longest_prefix_wins_and_counts_hits_misses_and_partial_hits() -> None:
    cache = PrefixCache([10, 11, 12], max_tokens=1000, min_match=4)
    assert cache.insert("t", SYSTEM + [1, 2, 3]) == Insertion(10, 43, ())
    assert cache.insert("t", SYSTEM + [9, 9]) == Insertion(11, 42, ())
    assert cache.match("t", SYSTEM + [1, 2, 3, 4], max_length=100) == Match(10, 43)
    assert cache.match("t", SYSTEM + [9, 8], max_length=100) == Match(11, 41)
    # the shared 40 tokens: the most recently used entry holding them
    assert cache.match("t", SYSTEM + [5], max_length=100) == Match(11, 40)
    assert cache.match("t", [1, 2, 3], max_length=100) is None
    assert cache.match("t", SYSTEM[:3], max_length=100) is None  # under min_match
    s = cache.stats
    assert (s.hits, s.misses, s.partial_hits, s.matched_tokens) == (3, 2, 2, 43 + 41 + 40)


def test_match_never_exceeds_max_length() -> None:
    cache = PrefixCache([1], max_tokens=100, min_match=1)
    cache.insert("", [5, 6, 7, 8])
    assert cache.match("", [5, 6, 7, 8], max_length=3) == Match(1, 3)


def test_namespaces_never_share_prefixes() -> None:
    cache = PrefixCache([1, 2], max_tokens=1000, min_match=1)
    cache.insert("tenant-a", SYSTEM)
    assert cache.match("tenant-b", SYSTEM + [1], max_length=100) is None
    assert cache.match("tenant-a", SYSTEM + [1], max_length=100) == Match(1, 40)


def test_an_extended_conversation_replaces_its_entry_in_place() -> None:
    cache = PrefixCache([1, 2], max_tokens=1000, min_match=1)
    cache.insert("", SYSTEM + [1])
    assert cache.insert("", SYSTEM + [1, 2, 3]) == Insertion(1, 43, ())
    assert cache.num_entries == 1 and cache.entry_tokens(1) == SYSTEM + [1, 2, 3]
    # an already covered sequence is not inserted twice
    assert cache.insert("", SYSTEM) is None and cache.num_entries == 1


def test_lru_eviction_when_slots_run_out_and_recency_updates_on_match() -> None:
    cache = PrefixCache([1, 2], max_tokens=1000, min_match=1)
    cache.insert("", [1] * 5)
    cache.insert("", [2] * 5)
    cache.match("", [1] * 6, max_length=10)  # entry 1 is now the most recent
    assert cache.insert("", [3] * 5) == Insertion(2, 5, (2,))
    assert cache.entry_tokens(1) == [1] * 5 and cache.entry_tokens(2) == [3] * 5
    assert cache.stats.evictions == 1


def test_token_budget_evicts_least_recently_used_entries() -> None:
    cache = PrefixCache([1, 2, 3], max_tokens=10, min_match=1)
    cache.insert("", [1] * 4)
    cache.insert("", [2] * 4)
    inserted = cache.insert("", [3] * 4)
    assert inserted == Insertion(3, 4, (1,))
    assert cache.cached_tokens == 8
    assert cache.insert("", [4] * 11) is None  # larger than the whole budget


def test_removing_entries_prunes_and_merges_the_tree() -> None:
    cache = PrefixCache([1, 2], max_tokens=1000, min_match=1)
    cache.insert("", [1, 2, 3, 4])
    cache.insert("", [1, 2, 9])
    cache.remove(2)
    fresh = PrefixCache([1, 2], max_tokens=1000, min_match=1)
    fresh.insert("", [1, 2, 3, 4])
    # same tree shape as if [1, 2, 9] had never been there
    assert cache.state()[5] == fresh.state()[5]
    assert cache.clear() == [1] and cache.match("", [1, 2], max_length=5) is None


operations = st.lists(
    st.tuples(
        st.sampled_from(["insert", "match", "remove"]),
        st.sampled_from(["", "a"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=8),
        st.integers(0, 3),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_the_index_round_trips_through_bytes_to_an_equal_state(ops: list) -> None:  # type: ignore[type-arg]
    cache = PrefixCache([0, 1, 2, 3], max_tokens=20, min_match=2)
    for op, namespace, tokens, slot in ops:
        if op == "insert":
            cache.insert(namespace, tokens)
        elif op == "match":
            cache.match(namespace, tokens, max_length=len(tokens))
        else:
            cache.remove(slot)
    restored = PrefixCache.from_bytes(cache.to_bytes())
    assert restored.state() == cache.state()
    probe = [0, 1, 2, 3, 0, 1]
    assert restored.match("", probe, max_length=6) == cache.match("", probe, max_length=6)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_matches_agree_with_a_brute_force_search(ops: list) -> None:  # type: ignore[type-arg]
    cache = PrefixCache([0, 1, 2, 3], max_tokens=20, min_match=1)
    for op, namespace, tokens, slot in ops:
        if op == "insert":
            cache.insert(namespace, tokens)
        elif op == "remove":
            cache.remove(slot)
        else:
            entries = {
                s: cache.entry_tokens(s)
                for s in range(4)
                if cache.entry_tokens(s) is not None and cache._entries[s].namespace == namespace
            }
            best = max(
                (_common(t or [], tokens) for t in entries.values()),
                default=0,
            )
            recency = [s for s, _, _ in cache.entries()]  # least recently used first
            longest = [
                s for s in recency if s in entries and _common(entries[s] or [], tokens) == best
            ]
            found = cache.match(namespace, tokens, max_length=len(tokens))
            assert (found.length if found else 0) == best
            if found is not None:
                assert found.slot == longest[-1]  # the most recent of the longest
        assert cache.cached_tokens <= 20
        last_used = {s: cache._entries[s].last_used for s in cache._entries}
        assert [s for s, _, _ in cache.entries()] == sorted(last_used, key=last_used.__getitem__)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_evict_all_passes_every_entry_through_the_eviction_hook() -> None:
    cache = PrefixCache([10, 11], max_tokens=100)
    seen: list[tuple[int, str, list[int]]] = []
    cache.on_evict = lambda slot, namespace, tokens: seen.append((slot, namespace, tokens))
    a = cache.insert("t", [1, 2, 3])
    b = cache.insert("u", [4, 5])
    assert a is not None and b is not None
    assert sorted(cache.evict_all()) == [10, 11]
    assert sorted(seen) == [(10, "t", [1, 2, 3]), (11, "u", [4, 5])]
    assert cache.num_entries == 0 and cache.stats.evictions == 2


def test_a_prefix_every_entry_shares_picks_the_most_recent_entry() -> None:
    # more entries than `_most_recent` compares directly: the recency order answers
    system = [7] * 10
    cache = PrefixCache(list(range(12)), max_tokens=1000, min_match=4)
    for i in range(12):
        cache.insert("", system + [i])
    cache.match("", system + [3], max_length=11)  # entry 3 is the most recent now
    found = cache.match("", system + [99], max_length=11)
    assert found is not None and (found.slot, found.length) == (3, 10)
    # and the least recent is the one evicted
    assert cache.insert("", [5] * 8) == Insertion(0, 8, (0,))
