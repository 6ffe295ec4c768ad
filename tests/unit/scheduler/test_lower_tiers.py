"""The scheduler's use of the lower tiers and the slot cache's tenant quota and
eviction hook (pure logic; the restore itself is tested on the model)."""

from __future__ import annotations

from inferflux.scheduler import Request, RequestId, Scheduler
from inferflux.scheduler.lower_tiers import LowerTierHit
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import KvCopy, KvRestore

PROMPT = list(range(100, 160))


class FakeLowerTiers:
    def __init__(self, length: int) -> None:
        self.length = length
        self.asked: list[int] = []

    def match(self, namespace, token_ids, *, max_length, have):  # type: ignore[no-untyped-def]
        self.asked.append(have)
        if self.length <= have:
            return None
        return LowerTierHit("k", min(self.length, max_length))


def _scheduler(cache: PrefixCache, tiers: FakeLowerTiers) -> Scheduler:
    scheduler = Scheduler(
        max_num_seqs=2, max_batch_tokens=256, kv_capacity=None, prefix_cache=cache
    )
    scheduler.lower_tiers = tiers
    return scheduler


def _request(rid: str) -> Request:
    return Request(request_id=RequestId(rid), prompt_token_ids=list(PROMPT), max_tokens=4)


def test_a_longer_lower_tier_hit_is_restored_instead_of_the_slot_copy() -> None:
    cache = PrefixCache([8], max_tokens=1000, min_match=4)
    cache.insert("", PROMPT[:20])
    tiers = FakeLowerTiers(length=50)
    scheduler = _scheduler(cache, tiers)
    scheduler.add(_request("r"))
    out = scheduler.schedule()
    assert out.kv_ops == [KvRestore("k", out.chunks[0].seq_id, 50, out.chunks[0].request)]
    assert tiers.asked == [20]  # it knew the slot match
    assert out.chunks[0].start_pos == 50 and out.chunks[0].request.num_cached_tokens == 50


def test_a_slot_match_at_least_as_long_is_kept() -> None:
    cache = PrefixCache([8], max_tokens=1000, min_match=4)
    cache.insert("", PROMPT[:40])
    scheduler = _scheduler(cache, FakeLowerTiers(length=30))
    scheduler.add(_request("r"))
    out = scheduler.schedule()
    assert isinstance(out.kv_ops[0], KvCopy) and out.chunks[0].start_pos == 40


def test_a_failed_restore_recomputes_from_the_start() -> None:
    cache = PrefixCache([8], max_tokens=1000, min_match=4)
    scheduler = _scheduler(cache, FakeLowerTiers(length=50))
    request = _request("r")
    scheduler.add(request)
    scheduler.schedule()
    scheduler.cache_copy_failed(request)
    assert request.num_computed_tokens == 0 and request.num_cached_tokens == 0


def test_the_eviction_hook_sees_each_evicted_entry_before_it_is_gone() -> None:
    cache = PrefixCache([1, 2], max_tokens=1000)
    seen: list[tuple[int, str, list[int]]] = []
    cache.on_evict = lambda slot, ns, tokens: seen.append((slot, ns, list(tokens)))
    cache.insert("a", [1, 2, 3])
    cache.insert("b", [4, 5, 6])
    cache.insert("c", [7, 8, 9])  # evicts a's entry (LRU) from slot 1
    assert seen == [(1, "a", [1, 2, 3])]
    assert cache.entries() == [(2, "b", [4, 5, 6]), (1, "c", [7, 8, 9])]
    cache.insert("c", [7, 8, 9, 10])  # extends c's entry in place: not an eviction
    assert len(seen) == 1


def test_a_tenant_over_its_quota_evicts_only_its_own_entries() -> None:
    cache = PrefixCache([1, 2, 3, 4], max_tokens=1000, namespace_max_tokens=10)
    cache.insert("quiet", [9] * 8)
    for i in range(6):
        cache.insert("noisy", [i] * 4)
    assert cache.namespace_tokens("noisy") <= 10
    assert cache.namespace_tokens("quiet") == 8  # never evicted by the noisy tenant
    assert cache.insert("noisy", [7] * 11) is None  # larger than the quota alone
    # with every slot full, a noisy insert over quota reuses one of its own slots
    cache.insert("other", [5] * 3)
    cache.insert("noisy", [8] * 4)
    assert cache.namespace_tokens("quiet") == 8 and cache.namespace_tokens("other") == 3
