"""The host and disk tiers' bookkeeping (pure logic, FakeBlobDisk): budgets never
exceeded, LRU per tier, redundant entries skipped, quotas per namespace, and a full
write queue dropping instead of waiting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from inferflux.engine.kv_tiers import KvTierStore
from tests.fakes.blob_disk import FakeBlobDisk


def blob(n_tokens: int) -> bytes:
    return bytes(10 * n_tokens)  # 10 "bytes per token"


def test_host_overflow_demotes_lru_to_disk_then_disk_lru_is_deleted() -> None:
    disk = FakeBlobDisk()
    store = KvTierStore(host_max_bytes=250, disk_max_bytes=250, disk=disk, min_match=1)
    a = store.put("t", [1] * 10, blob(10))
    b = store.put("t", [2] * 10, blob(10))
    assert a and b and store.bytes_in("host") == 200
    c = store.put("t", [3] * 10, blob(10))  # a (LRU) goes to disk
    assert [e.tier for e in store.entries()] == ["disk", "host", "host"]
    assert store.stats.host_evictions == 1 and a in disk.pending
    store.get(b)  # b is now the most recent host entry
    store.put("t", [4] * 10, blob(10))  # c goes to disk
    store.put("t", [5] * 10, blob(10))  # b goes to disk: a (disk LRU) is deleted
    assert a not in disk.pending and store.stats.disk_evictions == 1
    assert store.bytes_in("disk") == 200 and store.bytes_in("host") == 200
    assert c is not None and store.get(c) == blob(10)  # read back from disk


def test_match_prefers_the_longest_prefix_then_the_smaller_blob() -> None:
    store = KvTierStore(host_max_bytes=10_000, min_match=2)
    store.put("t", [1, 2, 3, 4], blob(4))
    store.put("t", [1, 2, 9, 9, 9, 9], blob(6))
    found = store.match("t", [1, 2, 3, 4, 5], max_length=10)
    assert found is not None and (found.length, found.num_entry_tokens) == (4, 4)
    found = store.match("t", [1, 2, 7], max_length=10)
    assert found is not None and (found.length, found.num_entry_tokens) == (2, 4)
    assert store.match("t", [1, 2, 3, 4], max_length=3).length == 3  # type: ignore[union-attr]
    assert store.match("other", [1, 2, 3], max_length=10) is None
    assert store.match("t", [1, 5], max_length=10) is None  # under min_match


def test_covered_entries_are_skipped_and_longer_ones_replace_them() -> None:
    store = KvTierStore(host_max_bytes=10_000)
    assert store.put("t", [1, 2, 3], blob(3)) is not None
    assert store.put("t", [1, 2], blob(2)) is None  # covered by [1, 2, 3]
    assert store.put("t", [1, 2, 3, 4], blob(4)) is not None  # replaces [1, 2, 3]
    assert [e.token_ids for e in store.entries()] == [[1, 2, 3, 4]]
    assert store.bytes_in("host") == 40


def test_a_full_write_queue_drops_the_entry_instead_of_waiting() -> None:
    disk = FakeBlobDisk(queue_depth=1)
    store = KvTierStore(host_max_bytes=100, disk_max_bytes=1000, disk=disk)
    store.put("t", [1] * 10, blob(10))
    store.put("t", [2] * 10, blob(10))  # [1]* goes to disk (queue: 1)
    store.put("t", [3] * 10, blob(10))  # [2]* cannot be queued: dropped
    assert store.stats.dropped_writes == 1
    assert [e.token_ids[0] for e in store.entries()] == [1, 3]


def test_one_namespace_over_its_quota_evicts_only_its_own_entries() -> None:
    store = KvTierStore(host_max_bytes=10_000, namespace_max_tokens=20)
    store.put("quiet", [7] * 15, blob(15))
    for i in range(5):
        store.put("noisy", [i] * 10, blob(10))
    assert store.namespace_tokens("noisy") == 20
    assert store.namespace_tokens("quiet") == 15
    assert store.stats.quota_evictions == 3
    assert store.put("noisy", [9] * 21, blob(21)) is None  # over the quota alone


operations = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "match", "complete", "remove"]),
        st.sampled_from(["a", "b"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=12),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(
    operations,
    st.integers(0, 200),
    st.integers(0, 300),
    st.integers(1, 4),
    st.none() | st.integers(4, 30),
)
def test_budgets_and_quotas_always_hold(ops, host_max, disk_max, depth, quota) -> None:
    """Random insert / evict / restore sequences: each tier's bytes (counting writes in
    flight) stay within its budget, the counters agree with the entries, and each
    namespace stays within its quota."""
    disk = FakeBlobDisk(queue_depth=depth)
    store = KvTierStore(
        host_max_bytes=host_max, disk_max_bytes=disk_max, disk=disk, namespace_max_tokens=quota
    )
    for op, namespace, tokens in ops:
        if op == "put":
            store.put(namespace, tokens, blob(len(tokens)))
        elif op == "get":
            found = store.match(namespace, tokens, max_length=len(tokens))
            if found is not None:
                assert store.get(found.key) == blob(found.num_entry_tokens)
        elif op == "match":
            store.match(namespace, tokens, max_length=len(tokens) - 1)
        elif op == "complete":
            disk.complete()
        elif store.entries():
            store.remove(store.entries()[0].key)
        entries = store.entries()
        host = sum(e.nbytes for e in entries if e.tier == "host")
        on_disk = sum(e.nbytes for e in entries if e.tier == "disk")
        assert host == store.bytes_in("host") <= host_max
        assert on_disk == store.bytes_in("disk") <= max(disk_max, 0)
        assert disk.total_bytes() == on_disk  # no orphaned files, nothing unaccounted
        assert store.stats.host_entries + store.stats.disk_entries == len(entries)
        if quota is not None:
            for ns in ("a", "b"):
                assert store.namespace_tokens(ns) <= quota


def test_shutdown_demotion_keeps_the_most_recent_entries_on_disk() -> None:
    disk = FakeBlobDisk()
    store = KvTierStore(host_max_bytes=1000, disk_max_bytes=250, disk=disk)
    for i in range(4):
        store.put("t", [i] * 10, blob(10))  # 0 is the oldest
    assert store.demote_all() == 2
    assert sorted(e.token_ids[0] for e in store.entries()) == [2, 3]
    assert store.bytes_in("disk") == 200 and store.bytes_in("host") == 0


def test_memory_pressure_sheds_the_host_tier_to_disk_or_drops_it() -> None:
    disk = FakeBlobDisk(queue_depth=2)
    store = KvTierStore(host_max_bytes=1000, disk_max_bytes=1000, disk=disk)
    for i in range(3):
        store.put("t", [i] * 10, blob(10))
    assert store.shed_host() == 3
    assert store.bytes_in("host") == 0
    # the write queue took two; the third could not wait and was dropped
    assert len(store.entries()) == 2 and all(e.tier == "disk" for e in store.entries())
    no_disk = KvTierStore(host_max_bytes=1000, disk_max_bytes=0, disk=None)
    no_disk.put("t", [1] * 10, blob(10))
    assert no_disk.shed_host() == 1 and no_disk.entries() == []
