"""Replica picking: prefix affinity with balance thresholds, least loaded, round robin."""

from __future__ import annotations

from inferflux.config.router_settings import RouterSettings
from inferflux.router.prefix_index import PrefixIndex, last_full_block, prompt_blocks
from inferflux.router.replicas import PromptKey, Replica, ReplicaPicker

BLOCK = 16


def _setup(routing: str = "prefix_affinity", n: int = 3, **kw):
    settings = RouterSettings(
        replicas=[f"http://127.0.0.1:{9000 + i}" for i in range(n)],
        routing=routing,
        affinity_block_chars=BLOCK,
        **kw,
    )
    replicas = [Replica(i, url, healthy=True) for i, url in enumerate(settings.replicas)]
    return replicas, ReplicaPicker(settings, PrefixIndex(n, 1000))


def _key(text: str) -> PromptKey:
    return PromptKey(prompt_blocks(b"s", text, BLOCK), last_full_block(len(text), BLOCK))


def test_round_robin_cycles_over_candidates():
    replicas, picker = _setup("round_robin")
    got = [picker.pick(replicas, _key("x")).replica.index for _ in range(4)]
    assert got == [0, 1, 2, 0]
    assert picker.pick([replicas[0], replicas[2]], _key("x")).replica.index == 2


def test_least_loaded_and_ties_rotate():
    replicas, picker = _setup("least_loaded")
    replicas[0].num_in_flight = 2
    got = {picker.pick(replicas, _key("x")).replica.index for _ in range(4)}
    assert got == {1, 2}
    replicas[1].queue_depth = 5  # reported load counts too
    assert picker.pick(replicas, _key("x")).replica.index == 2


def test_conversation_turns_stick_to_their_replica():
    replicas, picker = _setup()
    turn_one = "conversation A " * 5
    first = picker.pick(replicas, _key(turn_one))
    assert first.decision == "least_loaded"
    first.replica.num_in_flight = 2  # the others are less loaded: affinity still wins
    second = picker.pick(replicas, _key(turn_one + "answer; next question"))
    assert second.replica is first.replica and second.decision == "affinity"
    assert second.num_matched_blocks == len(turn_one) // BLOCK


def test_the_same_prompt_again_sticks():
    replicas, picker = _setup()
    prompt = "the same prompt " * 3 + "tail"
    home = picker.pick(replicas, _key(prompt)).replica
    again = picker.pick(replicas, _key(prompt))
    assert again.replica is home and again.decision == "affinity"


def test_a_hot_system_prompt_spreads_new_conversations():
    replicas, picker = _setup()
    system = "You are a careful assistant. " * 6
    got = [
        picker.pick(replicas, _key(system + f"question {i}" * 3)).replica.index for i in range(6)
    ]
    assert sorted(got) == [0, 0, 1, 1, 2, 2]


def test_imbalance_sends_the_turn_to_the_least_loaded():
    for in_flight, moved in ((3, True), (2, False)):  # 3 - 0 > 2 and 3 > 0 * 1.5; 2 - 0 <= 2
        replicas, picker = _setup(balance_abs_threshold=2, balance_rel_threshold=1.5)
        turn_one = "conversation B " * 5
        home = picker.pick(replicas, _key(turn_one)).replica
        home.num_in_flight = in_flight
        pick = picker.pick(replicas, _key(turn_one + "more"))
        assert (pick.replica is not home) == moved
        assert pick.decision == ("balanced" if moved else "affinity")


def test_only_candidates_are_picked():
    replicas, picker = _setup()
    turn_one = "conversation C " * 5
    home = picker.pick(replicas, _key(turn_one)).replica
    rest = [r for r in replicas if r is not home]
    assert picker.pick(rest, _key(turn_one + "x")).replica in rest


def test_load_is_the_larger_of_own_and_reported():
    replica = Replica(0, "http://a", num_in_flight=2, queue_depth=1, num_running=4)
    assert replica.load == 5
    replica.num_in_flight = 9
    assert replica.load == 9


def test_eject_and_admit_report_transitions():
    replica = Replica(0, "http://a", healthy=True)
    assert replica.eject("gone") and not replica.eject("still gone")
    assert replica.num_ejections == 1 and not replica.healthy
    assert replica.admit() and not replica.admit()
