"""`/server/stats` speculative section: totals and what the goodput gate learned."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from inferflux.api.stats import speculative_stats
from inferflux.engine.messages import SpeculativeStats
from inferflux.engine.protocol import WorkerStatus
from inferflux.engine.speculative import MATCH_BUCKETS, MatchPrior


def _status(spec: SpeculativeStats | None) -> WorkerStatus:
    return cast(WorkerStatus, SimpleNamespace(stats=SimpleNamespace(speculative=spec)))


def _worker(prior: MatchPrior, drafted: int, accepted: int) -> SpeculativeStats:
    return SpeculativeStats(
        chunks=1,
        drafted_tokens=drafted,
        accepted_tokens=accepted,
        match_rates=list(prior.rates),
        match_seen=list(prior.seen),
    )


def test_the_match_length_table_weights_each_worker_by_the_positions_it_saw() -> None:
    copying, chatting = MatchPrior(), MatchPrior()
    for _ in range(3):
        copying.record(32, 1, 1)  # 3 hits at the 32+ bucket
    chatting.record(32, 1, 0)  # 1 miss there
    stats = speculative_stats(
        [_status(_worker(copying, 3, 3)), _status(_worker(chatting, 1, 0)), _status(None)]
    )
    assert stats is not None
    assert stats["drafted_tokens"] == 4 and stats["acceptance_rate"] == 0.75
    table = cast(list[dict[str, float]], stats["by_match_length"])
    assert [row["from"] for row in table] == list(MATCH_BUCKETS)
    longest = table[-1]
    assert longest["positions"] == 4
    expected = (copying.rate(32) * 3 + chatting.rate(32)) / 4
    assert abs(longest["acceptance"] - expected) < 1e-4
    # a bucket nobody verified shows the starting prior
    assert table[0] == {"from": 2, "acceptance": 0.5, "positions": 0}


def test_no_worker_speculating_is_none() -> None:
    assert speculative_stats([_status(None)]) is None
