"""`PoolRouter`: each `scheduler.routing` strategy, the balance thresholds that stop a hot
prefix from pulling all traffic onto one worker, workers joining, leaving and restarting,
and the bounded prefix index behind `prefix_affinity`."""

from __future__ import annotations

import pytest

from inferflux.config.settings import SchedulerSettings
from inferflux.engine.prefix_index import BLOCK_TOKENS, PrefixIndex, block_hashes
from inferflux.engine.routing import PoolRouter, RouteRequest, WorkerLoad, make_worker_router
from inferflux.errors import NoWorkerReady, QueueFull

AFFINITY = SchedulerSettings(routing="prefix_affinity")


def policy(routing: str = "prefix_affinity", **knobs: object) -> SchedulerSettings:
    return SchedulerSettings.model_validate({"routing": routing, **knobs})


def load(worker_id: int, in_flight: int = 0, **fields: int | bool) -> WorkerLoad:
    values: dict = {"generation": 1, "ready": True, "num_in_flight": in_flight, **fields}
    return WorkerLoad(worker_id=worker_id, **values)


def request(
    request_id: str, tokens: list[int], max_tokens: int = 8, namespace: str = ""
) -> RouteRequest:
    return RouteRequest(request_id, tokens, max_tokens, namespace)


def conversation(seed: int, n: int = 64) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


# -- the prefix index ---------------------------------------------------------------------
def test_block_hashes_chain_full_blocks_and_continue_from_a_prefix() -> None:
    tokens = list(range(50))
    hashes = block_hashes("", tokens)
    assert len(hashes) == 50 // BLOCK_TOKENS
    assert block_hashes("", tokens + [7] * 30)[:3] == hashes
    assert block_hashes("", tokens + [7] * 30, prefix=hashes) == block_hashes("", tokens + [7] * 30)
    changed = [99] + tokens[1:]
    assert all(a != b for a, b in zip(block_hashes("", changed), hashes, strict=True))


def test_namespaces_never_share_hashes() -> None:
    tokens = list(range(64))
    assert set(block_hashes("tenant-a", tokens)).isdisjoint(block_hashes("tenant-b", tokens))


def test_index_matches_leading_blocks_only() -> None:
    index = PrefixIndex()
    hashes = block_hashes("", list(range(64)))
    index.insert(0, hashes[:2], capacity=100)
    assert index.match(0, hashes) == 2
    assert index.match(1, hashes) == 0
    other_start = block_hashes("", [9] * BLOCK_TOKENS + list(range(BLOCK_TOKENS, 64)))
    assert index.match(0, other_start) == 0  # same later blocks, another beginning


def test_index_is_lru_bounded_and_evicts_deep_blocks_first() -> None:
    index = PrefixIndex()
    first = block_hashes("", conversation(1))  # 4 blocks
    second = block_hashes("", conversation(2))
    index.insert(0, first, capacity=6)
    index.insert(0, second, capacity=6)
    assert index.num_blocks(0) == 6
    assert index.match(0, second) == 4
    assert index.match(0, first) == 2  # first's two deepest blocks went first
    index.forget(0)
    assert index.num_blocks(0) == 0 and index.match(0, second) == 0


# -- strategies -----------------------------------------------------------------------------
def test_least_loaded_picks_fewest_in_flight_lowest_id_on_ties() -> None:
    router = PoolRouter()
    least = policy("least_loaded")
    workers = [load(0, 3), load(1, 1), load(2, 1)]
    route = router.route(request("r1", conversation(1)), workers, least)
    assert (route.worker_id, route.strategy, route.outcome) == (1, "least_loaded", "least_loaded")


def test_round_robin_cycles_over_ready_workers_as_they_come_and_go() -> None:
    router = PoolRouter()
    rr = policy("round_robin")
    workers = [load(0), load(1), load(2, ready=False)]
    picks = [router.route(request(f"r{i}", [1]), workers, rr).worker_id for i in range(4)]
    assert picks == [0, 1, 0, 1]
    workers = [load(0), load(1), load(2), load(5)]  # 2 ready again, 5 joined
    picks = [router.route(request(f"s{i}", [1]), workers, rr).worker_id for i in range(4)]
    assert picks == [2, 5, 0, 1]
    workers = [load(0), load(5)]  # 1 and 2 left
    picks = [router.route(request(f"t{i}", [1]), workers, rr).worker_id for i in range(3)]
    assert picks == [5, 0, 5]


def test_no_ready_worker_is_no_worker_ready() -> None:
    router = PoolRouter()
    for strategy in ("prefix_affinity", "least_loaded", "round_robin", "memory_aware"):
        with pytest.raises(NoWorkerReady):
            router.route(request("r", [1]), [load(0, ready=False)], policy(strategy))
    with pytest.raises(NoWorkerReady):
        router.route_any([])


def test_prefix_affinity_follows_a_conversation_to_its_worker() -> None:
    router = PoolRouter()
    turn1 = conversation(1)
    first = router.route(request("a1", turn1), [load(0, 1), load(1, 0)], AFFINITY)
    assert (first.worker_id, first.outcome) == (1, "least_loaded")  # nothing known yet
    answer = [555] * 20
    router.finish("a1", turn1 + answer[:-1])
    turn2 = turn1 + answer + [777] * 10
    second = router.route(request("a2", turn2), [load(0, 0), load(1, 1)], AFFINITY)
    assert (second.worker_id, second.outcome) == (1, "affinity")
    # the answer's tokens were indexed too: the match runs past the first prompt
    assert second.matched_tokens == (len(turn1) + len(answer) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert second.matched_tokens > len(turn1)


def test_prefix_affinity_records_at_routing_so_concurrent_twins_follow() -> None:
    router = PoolRouter()
    prompt = conversation(3)
    assert router.route(request("a", prompt), [load(0), load(1)], AFFINITY).worker_id == 0
    twin = router.route(request("b", prompt + [1, 2]), [load(0, 1), load(1)], AFFINITY)
    assert (twin.worker_id, twin.outcome) == (0, "affinity")


def test_a_short_match_goes_least_loaded() -> None:
    router = PoolRouter()
    shared = conversation(4, n=BLOCK_TOKENS)  # one block in common only
    router.route(request("a", shared + conversation(5)), [load(0), load(1)], AFFINITY)
    route = router.route(request("b", shared + conversation(6)), [load(0, 1), load(1)], AFFINITY)
    assert (route.worker_id, route.outcome) == (1, "least_loaded")
    low = policy(affinity_min_match_tokens=BLOCK_TOKENS)
    route = router.route(request("c", shared + conversation(7)), [load(0, 1), load(1, 1)], low)
    assert (route.worker_id, route.outcome) == (0, "affinity")


@pytest.mark.parametrize(
    ("loads", "outcome"),
    [
        ((4, 0), "affinity"),  # 4 > 0 + 4 is false
        ((5, 0), "balanced"),  # 5 > 0 + 4 and 5 > 0 × 1.5
        ((8, 3), "balanced"),  # 8 > 7 and 8 > 4.5
        ((10, 6), "affinity"),  # 10 <= 6 + 4
        ((30, 25), "affinity"),  # 30 > 29 but 30 <= 37.5: relatively balanced
    ],
)
def test_balance_thresholds_abandon_an_overloaded_affinity(loads, outcome) -> None:
    router = PoolRouter()
    prompt = conversation(8)
    thresholds = policy(balance_abs_threshold=4, balance_rel_threshold=1.5)
    router.route(request("seed", prompt), [load(0), load(1, 1)], thresholds)
    router.finish("seed", None)
    busy, idle = loads
    route = router.route(request("r", prompt), [load(0, busy), load(1, idle)], thresholds)
    assert route.outcome == outcome
    assert route.worker_id == (0 if outcome == "affinity" else 1)


def test_a_hot_shared_prefix_spreads_instead_of_collapsing() -> None:
    """Every request shares one long system prompt; none finishes. Affinity alone would
    send all of them to the first worker; the thresholds keep the load within abs."""
    router = PoolRouter()
    system = conversation(9, n=256)
    in_flight = {0: 0, 1: 0}
    for i in range(40):
        workers = [load(w, n) for w, n in in_flight.items()]
        route = router.route(request(f"r{i}", system + [i] * 20), workers, AFFINITY)
        in_flight[route.worker_id] += 1
    assert abs(in_flight[0] - in_flight[1]) <= AFFINITY.balance_abs_threshold + 1


def test_ties_on_match_go_to_the_least_loaded() -> None:
    router = PoolRouter()
    prompt = conversation(10)
    router.route(request("a", prompt), [load(0), load(1)], AFFINITY)
    router.route(request("b", prompt), [load(0, 10), load(1)], AFFINITY)  # balanced → 1
    route = router.route(request("c", prompt), [load(0, 3), load(1, 2)], AFFINITY)
    assert (route.worker_id, route.outcome) == (1, "affinity")


def test_a_tenants_prefix_never_matches_another_namespace() -> None:
    router = PoolRouter()
    prompt = conversation(11)
    router.route(request("a", prompt, namespace="acme"), [load(0), load(1)], AFFINITY)
    other = router.route(request("b", prompt, namespace="globex"), [load(0, 1), load(1)], AFFINITY)
    assert (other.worker_id, other.outcome) == (1, "least_loaded")
    same = router.route(request("c", prompt, namespace="acme"), [load(0, 1), load(1, 1)], AFFINITY)
    assert (same.worker_id, same.outcome) == (0, "affinity")


def test_a_restarted_or_removed_worker_is_forgotten() -> None:
    router = PoolRouter()
    prompt = conversation(12)
    router.route(request("a", prompt), [load(0), load(1, 1)], AFFINITY)
    assert router.stats(0).indexed_blocks == 4
    restarted = [load(0, generation=2), load(1, 1)]
    route = router.route(request("b", prompt), restarted, AFFINITY)
    assert route.outcome == "least_loaded"  # worker 0's cache died with it
    router.route(request("c", prompt), [load(0, 1, generation=2), load(1, 1)], AFFINITY)
    assert router.stats(0).indexed_blocks == 4
    route = router.route(request("d", prompt), [load(1, 1), load(2)], AFFINITY)  # 0 removed
    assert route.worker_id == 2 and route.outcome == "least_loaded"
    assert router.stats(0).indexed_blocks == 0 and router.stats(0).decisions == {}
    router.finish("a", prompt)  # its worker is gone: nothing happens


def test_the_index_is_bounded_by_the_workers_prefix_cache() -> None:
    router = PoolRouter()
    small = [load(0, cache_max_tokens=8 * BLOCK_TOKENS, kv_cells_total=10_000)]
    for i in range(10):
        router.route(request(f"r{i}", conversation(20 + i)), small, AFFINITY)
        router.finish(f"r{i}", conversation(20 + i) + [1] * 40)
    assert router.stats(0).indexed_blocks == 8


# -- memory_aware -----------------------------------------------------------------------------
def test_memory_aware_picks_the_most_room_counting_unreported_reservations() -> None:
    router = PoolRouter()
    memory = policy("memory_aware")
    workers = [
        load(0, kv_cells_total=1000, kv_cells_used=600),
        load(1, kv_cells_total=1000, kv_cells_used=100, cache_max_tokens=200),
    ]
    first = router.route(request("a", [1] * 100, max_tokens=300), workers, memory)
    assert (first.worker_id, first.outcome) == (1, "memory_aware")  # 700 free vs 400
    # worker 1's stats do not show "a" yet: its 400 reserved cells count anyway
    second = router.route(request("b", [1] * 100, max_tokens=200), workers, memory)
    assert second.worker_id == 0  # 400 free vs 800 - 400: a tie goes to the first
    router.finish("a", None)
    third = router.route(request("c", [1] * 100, max_tokens=200), workers, memory)
    assert third.worker_id == 1


def test_memory_aware_refuses_with_queue_full_naming_the_setting() -> None:
    router = PoolRouter()
    memory = policy("memory_aware")
    workers = [load(0, kv_cells_total=500, kv_cells_used=400)]
    with pytest.raises(QueueFull) as refused:
        router.route(request("a", [1] * 50, max_tokens=100), workers, memory)
    assert "memory_aware" in refused.value.message and refused.value.http_status == 503
    assert refused.value.retry_after_s >= 1  # api/errors.py sends it as Retry-After
    assert router.stats(0).decisions == {("memory_aware", "refused"): 1}


def test_memory_aware_treats_a_worker_without_stats_as_empty() -> None:
    router = PoolRouter()
    workers = [load(0, kv_cells_total=500, kv_cells_used=400), load(1, 1)]
    route = router.route(request("a", [1] * 50, max_tokens=100), workers, policy("memory_aware"))
    assert route.worker_id == 1


# -- counters and embeddings ------------------------------------------------------------------
def test_decisions_are_counted_per_worker_strategy_and_outcome() -> None:
    router = make_worker_router()
    workers = [load(0), load(1, 1)]
    router.route(request("a", conversation(30)), workers, AFFINITY)
    router.route(request("b", conversation(30)), [load(0, 1), load(1, 1)], AFFINITY)
    router.route(request("c", [1]), workers, policy("round_robin"))
    stats = router.stats(0)
    assert stats.decisions == {
        ("prefix_affinity", "least_loaded"): 1,
        ("prefix_affinity", "affinity"): 1,
        ("round_robin", "round_robin"): 1,
    }
    assert stats.affinity_tokens == 64


def test_embeddings_go_to_the_least_loaded_without_bookkeeping() -> None:
    router = PoolRouter()
    assert router.route_any([load(0, 2), load(1, 1), load(2, 1, ready=False)]) == 1
    assert router.stats(1).decisions == {}
