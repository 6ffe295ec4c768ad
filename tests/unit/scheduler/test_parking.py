"""Parked slots: a finished request's KV stays in its slot and the request that continues
it keeps the shared positions in place (pure logic: scheduler/parking.py and the
scheduler's admission; the real engine: tests/integration/test_scheduling_engine.py)."""

from __future__ import annotations

import random

import pytest

from inferflux.scheduler import Request, RequestId, Scheduler, SchedulerOutput, SeqId
from inferflux.scheduler.lower_tiers import LowerTierHit
from inferflux.scheduler.parking import (
    CLAIM_SCAN,
    ParkedSlots,
    claimed_slots,
    common_prefix,
    packed_slot,
)
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import KvCopy, KvFree, KvKeep, KvMove, KvRestore, KvSave

CACHE_SLOTS = [2, 3]


def scheduler(*, park: bool = True, seqs: int = 2) -> Scheduler:
    return Scheduler(
        max_num_seqs=seqs,
        max_batch_tokens=64,
        kv_capacity=None,
        prefix_cache=PrefixCache(CACHE_SLOTS, max_tokens=1000, min_match=4),
        park=park,
    )


def request(rid: str, prompt: list[int], namespace: str = "") -> Request:
    return Request(RequestId(rid), prompt_token_ids=prompt, max_tokens=3, cache_namespace=namespace)


def run_to_end(sched: Scheduler, rid: str) -> list[SchedulerOutput]:
    """Step until `rid` has its 3 tokens, then finish it (cacheable) like EngineCore."""
    outs = []
    while True:
        out = sched.schedule()
        outs.append(out)
        for chunk in out.chunks:
            chunk.request.num_computed_tokens += len(chunk.token_ids)
            if chunk.sample:
                chunk.request.output_token_ids.append(99)
        req = sched.get(RequestId(rid))
        assert req is not None
        if len(req.output_token_ids) == 3:
            _, ops = sched.finish(RequestId(rid), cache=True)
            outs[-1].kv_ops.extend(ops)
            return outs


SYSTEM = list(range(100, 120))  # a 20-token shared start


@pytest.mark.parametrize(
    ("seed", "cases", "longest", "max_offset"),
    [(7, 500, 60, 0), (11, 300, 3000, 50)],
    ids=["short", "long-with-offsets"],
)
def test_common_prefix_matches_a_token_by_token_count(
    seed: int, cases: int, longest: int, max_offset: int
) -> None:
    """Short lists, then lists long enough for several galloping chunks (32, 64, 128, ...
    tokens) and the halvings after them, with the offset form the prefix cache's trie
    uses (`a` against `b[offset:]`)."""
    rng = random.Random(seed)
    for _ in range(cases):
        n = rng.randint(0, longest)
        a = [rng.randint(0, 3) for _ in range(n)]
        offset = rng.randint(0, max_offset)
        tail = [rng.randint(0, 3) for _ in range(rng.randint(0, 40))]
        b = [7] * offset + a[: rng.randint(0, n)] + tail
        limit = rng.randint(0, longest + 200)
        expected = 0
        while (
            expected < min(len(a), len(b) - offset, limit) and a[expected] == b[offset + expected]
        ):
            expected += 1
        assert common_prefix(a, b, limit, offset) == expected
    assert common_prefix([1, 2], [1], 5, offset=3) == 0  # an offset past the end


def _claims_by_hand(
    parked: ParkedSlots, mine: list[int], waiting: list[Request], free: list[int]
) -> set[int]:
    """What `claimed_slots` must answer, by hand."""
    claimed = set()
    for other in waiting[:CLAIM_SCAN]:
        tokens = other.prompt_token_ids + other.output_token_ids
        found = parked.best(other.cache_namespace, tokens, max_length=len(tokens) - 1, free=free)
        if found and found[1] > common_prefix(found[0].tokens, mine, len(mine) - 1):
            claimed.add(found[0].slot)
    return claimed


def test_claimed_slots_answer_as_a_fresh_lookup_while_slots_are_taken_and_parked() -> None:
    """`claimed_slots` answers what a lookup by hand would, as prefixes are taken
    (admissions) and parked (finishes) between the questions of one step."""
    rng = random.Random(3)
    for _ in range(200):
        parked = ParkedSlots(min_match=3)
        free = list(range(8))
        conversations = [
            SYSTEM + [rng.randint(0, 5) for _ in range(rng.randint(0, 12))] for _ in range(6)
        ]
        for slot in free:
            if rng.random() < 0.7:
                parked.park(slot, "", rng.choice(conversations)[: rng.randint(3, 32)])
        waiting = [
            request(f"w{i}", rng.choice(conversations) + [rng.randint(0, 5)]) for i in range(10)
        ]
        for _ in range(6):
            mine = rng.choice(conversations) + [9]
            assert claimed_slots(parked, mine, iter(waiting), free) == _claims_by_hand(
                parked, mine, waiting, free
            )
            if rng.random() < 0.5 and free:  # an admission takes a slot (and what it held)
                slot = rng.choice(free)
                free.remove(slot)
                parked.take(slot)
            else:  # a finish parks a prefix in a free slot
                slot = rng.choice(free) if free else None
                if slot is not None:
                    parked.park(slot, "", rng.choice(conversations)[: rng.randint(3, 32)])


def test_the_furthest_continuation_wins_and_ties_go_to_the_lowest_slot() -> None:
    parked = ParkedSlots(min_match=3)
    assert not parked.park(5, "", [1, 2])  # too short to be worth keeping
    parked.park(4, "", [1, 2, 3, 4])
    parked.park(1, "", [1, 2, 3, 9])
    parked.park(0, "other", [1, 2, 3, 4, 5])
    found = parked.best("", [1, 2, 3, 4, 5], max_length=4, free=[0, 1, 4])
    assert found is not None and (found[0].slot, found[1]) == (4, 4)
    found = parked.best("", [1, 2, 3, 7], max_length=10, free=[0, 1, 4])
    assert found is not None and (found[0].slot, found[1]) == (1, 3)  # tie: lowest
    assert parked.best("", [1, 2, 3, 4], max_length=10, free=[0]) is None  # namespaces
    assert parked.best("", [1, 2, 7], max_length=10, free=[1, 4]) is None  # < min_match
    parked.park(4, "", [1, 2, 3, 8, 8])  # parked again: its old prefix is gone
    found = parked.best("", [1, 2, 3, 4], max_length=10, free=[1, 4])
    assert found is not None and (found[0].slot, found[1]) == (1, 3)
    parked.take(1)
    found = parked.best("", [1, 2, 3, 8], max_length=10, free=[1, 4])
    assert found is not None and (found[0].slot, found[1]) == (4, 4)
    assert parked.clear() == [0, 4] and parked.best("", [1, 2, 3], max_length=9, free=[4]) is None


def test_the_next_turn_continues_its_slot_in_place_with_no_copy() -> None:
    sched = scheduler()
    sched.add(request("t1", SYSTEM + [1, 2, 3]))
    outs = run_to_end(sched, "t1")
    assert outs[0].chunks[0].seq_id == 0
    assert not any(op for out in outs for op in out.kv_ops)  # parked: no copy, no free
    history = SYSTEM + [1, 2, 3, 99, 99]  # the prompt and the answer's computed tokens
    assert sched.parked is not None and sched.parked.entries()[0].tokens == history
    t2 = request("t2", history + [99, 7, 8])  # the next turn
    sched.add(t2)
    out = sched.schedule()
    assert out.kv_ops == [KvKeep(SeqId(0), len(history), t2)]
    (chunk,) = out.chunks
    assert chunk.seq_id == 0 and chunk.start_pos == len(history)
    assert chunk.token_ids == [99, 7, 8]
    assert t2.num_cached_tokens == len(history)
    cache = sched.prefix_cache
    assert cache is not None and cache.stats.hits == 1 and cache.num_entries == 0


def test_a_request_that_shares_only_the_start_moves_the_rest_to_the_cache() -> None:
    sched = scheduler()
    sched.add(request("a", SYSTEM + [1, 2, 3, 4, 5]))
    run_to_end(sched, "a")
    b = request("b", SYSTEM + [7, 7, 7])
    sched.add(b)
    out = sched.schedule()
    # the parked conversation is copied into a cache slot, then cut to the shared start
    assert out.kv_ops == [KvCopy(SeqId(0), SeqId(2), 27), KvKeep(SeqId(0), 20, b)]
    assert out.chunks[0].seq_id == 0 and out.chunks[0].start_pos == 20
    cache = sched.prefix_cache
    assert cache is not None and cache.entries() == [(2, "", SYSTEM + [1, 2, 3, 4, 5, 99, 99])]


def test_a_request_that_shares_nothing_takes_the_lowest_slot_and_saves_what_it_held() -> None:
    sched = scheduler()
    sched.add(request("a", SYSTEM))
    run_to_end(sched, "a")
    other = request("o", [5, 6, 7, 8, 9])
    sched.add(other)
    out = sched.schedule()
    assert out.kv_ops == [KvCopy(SeqId(0), SeqId(2), 22), KvFree(SeqId(0))]
    assert out.chunks[0].seq_id == 0 and out.chunks[0].start_pos == 0
    assert sched.parked is not None and len(sched.parked) == 0


def test_another_namespace_never_continues_a_parked_prefix() -> None:
    sched = scheduler()
    sched.add(request("a", SYSTEM, namespace="tenant-a"))
    run_to_end(sched, "a")
    b = request("b", SYSTEM + [1], namespace="tenant-b")
    sched.add(b)
    out = sched.schedule()
    assert not any(isinstance(op, KvKeep) for op in out.kv_ops)
    assert out.chunks[0].start_pos == 0 and b.num_cached_tokens == 0


def test_a_longer_cached_prefix_beats_a_shorter_parked_one() -> None:
    sched = scheduler()
    cache = sched.prefix_cache
    assert cache is not None
    long_prefix = SYSTEM + [1, 2, 3, 4, 5, 6]
    cache.insert("", long_prefix)  # as if copied into slot 2 earlier
    sched.add(request("a", SYSTEM + [9, 9, 9, 9]))
    run_to_end(sched, "a")
    b = request("b", long_prefix + [8])
    sched.add(b)
    out = sched.schedule()
    assert KvCopy(SeqId(2), SeqId(0), len(long_prefix), request=b) in out.kv_ops
    assert out.chunks[0].start_pos == len(long_prefix)


def test_without_park_a_finish_copies_into_the_cache_as_before() -> None:
    sched = scheduler(park=False)
    sched.add(request("a", SYSTEM))
    outs = run_to_end(sched, "a")
    assert outs[-1].kv_ops == [KvCopy(SeqId(0), SeqId(2), 22), KvFree(SeqId(0))]
    assert sched.parked is None


def test_unified_kv_never_parks() -> None:
    sched = Scheduler(
        max_num_seqs=2,
        max_batch_tokens=64,
        kv_capacity=4096,
        prefix_cache=PrefixCache(CACHE_SLOTS, max_tokens=1000, min_match=4),
        park=True,
    )
    assert sched.parked is None


def test_dropping_parked_prefixes_names_their_slots() -> None:
    sched = scheduler()
    sched.add(request("a", SYSTEM))
    run_to_end(sched, "a")
    assert sched.drop_parked() == [0]
    sched.add(request("b", SYSTEM + [1]))
    out = sched.schedule()
    assert out.kv_ops == [] and out.chunks[0].start_pos == 0


class FakeLowerTiers:
    """A fake host tier for pure logic: it never holds a longer prefix."""

    def match(
        self, namespace: str, token_ids: list[int], *, max_length: int, have: int
    ) -> LowerTierHit | None:
        return None


def test_with_a_host_tier_a_displaced_prefix_is_saved_there_not_copied() -> None:
    sched = scheduler()
    sched.lower_tiers = FakeLowerTiers()
    sched.add(request("a", SYSTEM + [1, 2, 3, 4, 5]))
    run_to_end(sched, "a")
    b = request("b", SYSTEM + [7, 7, 7])
    sched.add(b)
    out = sched.schedule()
    saved = SYSTEM + [1, 2, 3, 4, 5, 99, 99]
    assert out.kv_ops == [KvSave(SeqId(0), "", saved), KvKeep(SeqId(0), 20, b)]
    cache = sched.prefix_cache
    assert cache is not None and cache.num_entries == 0


class FakeSavedPrefix:
    """A fake host tier holding one saved prefix of `length` tokens, worth restoring."""

    def __init__(self, length: int) -> None:
        self.length = length

    def match(
        self, namespace: str, token_ids: list[int], *, max_length: int, have: int
    ) -> LowerTierHit | None:
        if self.length - have < 4:
            return None
        return LowerTierHit("saved", min(self.length, max_length))


def test_a_longer_saved_prefix_beats_a_shorter_parked_one() -> None:
    """A conversation whose slot another request took (its prefix saved to the host tier)
    restores its own saved turn into a free slot instead of continuing some other parked
    slot over the shared system prompt only (seen: test_routing's turns cached 27 tokens
    of 43 under the full suite's timing)."""
    sched = scheduler()
    sched.lower_tiers = FakeSavedPrefix(length=len(SYSTEM) + 10)
    sched.add(request("a", SYSTEM + [9, 9, 9, 9]))
    run_to_end(sched, "a")  # parks SYSTEM + [9, 9, 9, 9, 99, 99] in slot 0
    b = request("b", SYSTEM + list(range(1, 12)))
    sched.add(b)
    out = sched.schedule()
    assert not any(isinstance(op, KvKeep) for op in out.kv_ops)
    restore = [op for op in out.kv_ops if isinstance(op, KvRestore)]
    assert restore and restore[0].n_tokens == len(SYSTEM) + 10
    assert out.chunks[0].start_pos == len(SYSTEM) + 10


def test_a_request_runs_where_the_running_slots_stay_in_one_run() -> None:
    assert packed_slot(set(), [0, 1, 2], prefer=0) == 0
    assert packed_slot(set(), [0, 1, 2], prefer=2) == 2  # nothing runs: in place
    assert packed_slot({0}, [1, 2, 3], prefer=3) == 1  # parked at 3: moved next to 0
    assert packed_slot({1, 2}, [0, 3, 4], prefer=3) == 3  # parked next to the run: in place
    assert packed_slot({3, 4}, [0, 1, 2, 5], prefer=0) == 2  # the lowest would split them
    assert packed_slot({0, 2}, [1, 3], prefer=3) == 1  # filling the hole joins the runs
    assert packed_slot({0, 5}, [1, 2, 3, 4, 6], prefer=3) == 1  # 2 runs at best: lowest


def test_a_parked_prefix_that_would_leave_a_gap_moves_next_to_the_running_slot() -> None:
    """A stream runs in slot 0, and a conversation's turn is parked in slot 2: its next
    turn is serialized into slot 1 (`KvMove`) rather than continued in place beside a
    gap, which would cost every step a second pass over the weights. Slot 2 keeps it."""
    sched = scheduler(seqs=3)
    stream = Request(RequestId("s"), prompt_token_ids=[1, 2, 3], max_tokens=50)
    for r in (stream, request("o", [5, 6, 7, 8, 9]), request("a", SYSTEM + [1, 2])):
        sched.add(r)
    while not sched.running or len(sched.running) > 1:  # o, a finish; s decodes on
        for chunk in sched.schedule().chunks:
            chunk.request.num_computed_tokens += len(chunk.token_ids)
            if chunk.sample:
                chunk.request.output_token_ids.append(99)
        for r in [r for r in sched.running if r is not stream and len(r.output_token_ids) == 3]:
            sched.finish(r.request_id, cache=True)
    assert stream.seq_id == 0
    history = SYSTEM + [1, 2, 99, 99]
    b = request("b", history + [99, 4])
    sched.add(b)
    out = sched.schedule()
    assert [op for op in out.kv_ops if isinstance(op, KvMove)] == [
        KvMove(SeqId(2), SeqId(1), len(history), b)
    ]
    assert not any(isinstance(op, KvKeep) for op in out.kv_ops)
    assert b.seq_id == 1 and b.num_cached_tokens == len(history)
    (chunk,) = [c for c in out.chunks if c.request is b]
    assert chunk.start_pos == len(history)
    assert sched.parked is not None and [p.slot for p in sched.parked.entries()] == [2]


def test_a_fresh_request_runs_next_to_the_running_slots_not_in_the_lowest() -> None:
    sched = scheduler(park=False, seqs=5)
    for i in range(4):
        sched.add(Request(RequestId(f"r{i}"), prompt_token_ids=[i, 1], max_tokens=50))
    sched.schedule()  # slots 0-3
    sched.finish(RequestId("r0"))
    sched.finish(RequestId("r1"))  # 2 and 3 run; 0, 1 and 4 are free
    late = request("late", [7, 7, 7])
    sched.add(late)
    sched.schedule()
    assert late.seq_id == 1  # the lowest free slot, 0, would leave a gap before 2


def test_a_parked_slot_a_waiting_request_continues_further_is_left_to_it() -> None:
    """A prompt that shares only the system prompt, admitted in the same step as the next
    turn of the conversation parked in slot 0, does not take slot 0: the turn's tokens
    saved from it would reach the host tier only after this step's admissions, so the
    turn would find them nowhere and compute them again."""
    sched = scheduler(seqs=3)
    sched.lower_tiers = FakeLowerTiers()
    sched.add(request("a", SYSTEM + [1, 2, 3]))
    run_to_end(sched, "a")
    history = SYSTEM + [1, 2, 3, 99, 99]
    noise, turn = request("n", SYSTEM + [7, 7]), request("a2", history + [99, 5])
    sched.add(noise)  # first in the queue
    sched.add(turn)
    out = sched.schedule()
    assert KvKeep(SeqId(0), len(history), turn) in out.kv_ops
    assert not any(isinstance(op, KvSave) for op in out.kv_ops)
    assert turn.seq_id == 0 and turn.num_cached_tokens == len(history)
    assert noise.seq_id == 1 and noise.num_cached_tokens == 0


def test_packed_slot_picks_what_counting_every_run_would() -> None:
    """`packed_slot` ranks candidates by the runs a slot adds (O(1)); counting the runs of
    the whole running set with each candidate must rank them the same."""

    def runs(slots: set[int]) -> int:
        return sum(1 for s in slots if s - 1 not in slots)

    rng = random.Random(13)
    for _ in range(500):
        slots = list(range(rng.randint(1, 24)))
        running = {s for s in slots if rng.random() < 0.5}
        free = [s for s in slots if s not in running]
        if not free:
            continue
        prefer = rng.choice(free) if rng.random() < 0.5 else min(free)
        candidates = {prefer, min(free)} | {s for s in free if s - 1 in running or s + 1 in running}
        expected = min(candidates, key=lambda s: (runs(running | {s}), s != prefer, s))
        assert packed_slot(running, free, prefer) == expected
