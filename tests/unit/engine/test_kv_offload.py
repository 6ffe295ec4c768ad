"""The restore rule and the spill/restore bookkeeping of KvOffload (pure logic over a
FakeKvBackend; real llama.cpp bytes: tests/integration/test_kv_state.py)."""

from __future__ import annotations

from inferflux.engine.kv_offload import KvOffload, OffloadConfig, RestoreCost
from inferflux.engine.kv_tiers import KvTierStore

LAYOUT = {"n_ctx_per_seq": 512}


class FakeKvBackend:
    """Sequence state as bytes of 100 per token; loads what it saved."""

    def __init__(self) -> None:
        self.seqs: dict[int, int] = {}  # seq id -> tokens held

    def save_seq(self, seq_id: int) -> bytes:
        return bytes([seq_id % 256]) * (100 * self.seqs.get(seq_id, 0))

    def load_seq(self, seq_id: int, data: bytes, n_tokens: int) -> bool:
        self.seqs[seq_id] = n_tokens
        return len(data) >= 100 * n_tokens

    def trim_seq(self, seq_id: int, n_tokens: int) -> bool:
        self.seqs[seq_id] = min(self.seqs.get(seq_id, 0), n_tokens)
        return True


def _offload(host_max_bytes: int = 1_000_000) -> tuple[KvOffload, FakeKvBackend]:
    backend = FakeKvBackend()
    store = KvTierStore(host_max_bytes=host_max_bytes, min_match=4)
    return KvOffload(backend, store, OffloadConfig(model_id="m", layout=LAYOUT)), backend


def test_the_rule_compares_restore_cost_with_prefilling_the_gain() -> None:
    cost = RestoreCost(prefill_s_per_token=1e-3, restore_overhead_s=1e-3)
    cost.restore_s_per_byte["disk"] = 1e-6
    assert cost.worth_restoring("disk", 1_000, gain_tokens=10)  # 2 ms < 10 ms
    assert not cost.worth_restoring("disk", 100_000, gain_tokens=10)  # 101 ms > 10 ms
    for _ in range(50):  # a much faster prefill is learned (steps of >= 32 tokens)
        cost.observe_prefill(100, 100 * 1e-5)
    assert not cost.worth_restoring("disk", 1_000, gain_tokens=10)
    cost.observe_prefill(4, 100.0)  # too small a step to say anything: ignored
    assert cost.prefill_s_per_token < 2e-5


def test_evicted_entries_are_spilled_then_restored_with_counters() -> None:
    offload, backend = _offload()
    backend.seqs[9] = 50
    offload.on_evict(9, "t", list(range(50)))
    offload.spill_pending()
    assert offload.stats.spills == 1 and offload.stats.host_entries == 1
    hit = offload.match("t", list(range(60)), max_length=59, have=10)
    assert hit is not None and hit.length == 50
    assert offload.restore(hit.key, 0, hit.length)
    assert backend.seqs[0] == 50
    s = offload.stats
    assert (s.restores, s.host_hits, s.restored_tokens, s.refusals) == (1, 1, 50, 0)
    # a second eviction of the same tokens is not serialized again
    offload.on_evict(9, "t", list(range(50)))
    offload.spill_pending()
    assert offload.stats.spills == 1


def test_no_hit_unless_longer_than_the_slot_match_and_cheaper() -> None:
    offload, backend = _offload()
    backend.seqs[9] = 50
    offload.on_evict(9, "t", list(range(50)))
    offload.spill_pending()
    assert offload.match("t", list(range(60)), max_length=59, have=48) is None  # gain < 4
    offload.cost.prefill_s_per_token = 1e-9  # recomputing is nearly free
    assert offload.match("t", list(range(60)), max_length=59, have=0) is None
    assert offload.stats.skipped == 1


def test_an_entry_replaced_since_its_match_restores_from_the_one_that_covers_it() -> None:
    """A longer save in the same step replaces the matched entry (`KvTierStore.put`); the
    restore finds the new entry by the request's tokens instead of recomputing them."""
    offload, backend = _offload()
    backend.seqs[9] = 50
    offload.on_evict(9, "t", list(range(50)))
    offload.spill_pending()
    hit = offload.match("t", list(range(60)), max_length=59, have=10)
    assert hit is not None and hit.length == 50
    backend.seqs[8] = 55
    offload.save_parked(8, "t", list(range(55)))  # covers the matched entry: replaces it
    assert offload.store.entry(hit.key) is None
    assert not offload.restore(hit.key, 0, hit.length)  # by key alone: gone
    assert offload.restore(hit.key, 0, hit.length, "t", list(range(60)))
    assert backend.seqs[0] == 50 and offload.stats.restored_tokens == 50
    assert not offload.restore(hit.key, 1, hit.length, "other", list(range(60)))


def test_a_refused_blob_is_dropped_and_counted() -> None:
    offload, backend = _offload()
    backend.seqs[9] = 50
    offload.on_evict(9, "t", list(range(50)))
    offload.spill_pending()
    (entry,) = offload.store.entries()
    assert entry.data is not None
    entry.data = entry.data[:-1]  # torn
    assert not offload.restore(entry.key, 0, 50)
    assert offload.stats.refusals == 1 and offload.store.entries() == []


def test_sliding_window_models_restore_only_whole_entries_longer_than_the_window() -> None:
    backend = FakeKvBackend()
    store = KvTierStore(host_max_bytes=1_000_000, min_match=4)
    config = OffloadConfig(model_id="m", layout={**LAYOUT, "n_swa": 16})
    offload = KvOffload(backend, store, config)
    backend.seqs[9] = 50
    offload.on_evict(9, "t", list(range(50)))
    offload.spill_pending()
    assert offload.match("t", list(range(30)) + [999], max_length=30, have=0) is None
    hit = offload.match("t", list(range(60)), max_length=59, have=0)
    assert hit is not None and hit.length == 50
