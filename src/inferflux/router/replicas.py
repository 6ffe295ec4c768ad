"""The replicas behind the router: their health, their load, and picking one.

Owns: `Replica` (one replica's state, mutated only on the router's event loop),
`ReplicaPicker` (the routing strategies: prefix affinity with balance thresholds,
least loaded, round robin). Does not own: reading health and load from the replicas
(`health.py`) or moving bytes (`proxy.py`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from inferflux.config.router_settings import RouterSettings
from inferflux.router.prefix_index import PrefixIndex, PrefixMatch, merge_matches

logger = logging.getLogger(__name__)

Decision = Literal["affinity", "balanced", "least_loaded", "round_robin"]


@dataclass(slots=True)
class Replica:
    """One replica. `healthy` starts False: the first passing health check admits it."""

    index: int
    url: str
    healthy: bool = False
    num_failures: int = 0  # consecutive failed health checks
    num_in_flight: int = 0  # requests this router has open there
    queue_depth: int = 0  # as the replica last reported (/metrics)
    num_running: int = 0
    kv_usage: float = 0.0
    num_requests: int = 0  # requests sent there (attempts included)
    num_ejections: int = 0
    last_error: str = ""
    retired: bool = False  # gone from replica_dns: out of rotation, not checked

    def reuse(self, url: str) -> None:
        """Make this retired slot a newly discovered replica at `url` (not yet checked)."""
        self.url, self.retired, self.healthy = url, False, False
        self.num_failures = self.queue_depth = self.num_running = 0
        self.kv_usage, self.last_error = 0.0, ""

    @property
    def load(self) -> int:
        """The router's own in-flight count, or what the replica reports (waiting +
        running, which also counts other routers' and direct clients' requests), whichever
        is larger: the router's count is current, the replica's up to one poll old."""
        return max(self.num_in_flight, self.queue_depth + self.num_running)

    def eject(self, reason: str) -> bool:
        """Take the replica out of rotation; True when it was in rotation."""
        self.last_error = reason
        if not self.healthy:
            return False
        self.healthy = False
        self.num_ejections += 1
        logger.warning("replica %d (%s) ejected: %s", self.index, self.url, reason)
        return True

    def admit(self) -> bool:
        """Put the replica (back) in rotation; True when it was out."""
        self.num_failures = 0
        if self.healthy:
            return False
        self.healthy = True
        logger.info("replica %d (%s) admitted", self.index, self.url)
        return True


@dataclass(frozen=True, slots=True)
class Pick:
    replica: Replica
    decision: Decision
    num_matched_blocks: int


@dataclass(frozen=True, slots=True)
class PromptKey:
    """A request's prompt as the index sees it: chained block hashes and the index of
    its last full block (-1: none)."""

    hashes: list[bytes]
    end: int


class ReplicaPicker:
    """Picks the replica for a request among the healthy ones not yet tried.

    prefix_affinity (SGLang's cache-aware policy, on text blocks, with one guard against
    its collapse): the replica that was sent the longest prefix of this prompt wins when
    that prefix ends where an earlier prompt ended there (the previous turn of this
    conversation, or the same prompt again). A match that ends inside an earlier prompt
    (a system prompt every conversation shares) is not a reason to stay: the replicas
    all cache it after their first miss, and following it would send every new
    conversation to the replica that saw the system prompt first. Those requests, and
    those that match nothing, go to the least loaded replica (ties rotate, so sequential
    traffic spreads too). A winner is also dropped for the least loaded replica when the
    load is imbalanced: its load exceeds the least loaded one's by more than
    `balance_abs_threshold` AND is more than `balance_rel_threshold` times it.
    Whatever was picked, the prompt's blocks are recorded for the replica that got it.
    """

    def __init__(self, settings: RouterSettings, index: PrefixIndex) -> None:
        self._settings = settings
        self._index = index
        self._next = 0

    def pick(
        self,
        candidates: list[Replica],
        prompt: PromptKey,
        shared: list[PrefixMatch] | None = None,
    ) -> Pick:
        """Choose among `candidates` (non-empty). Records the prompt's blocks there.
        `shared`: what the Redis directory knows of this prompt (other routers' picks)."""
        strategy = self._settings.routing
        if strategy == "round_robin":
            result = Pick(self._rotate(candidates), "round_robin", 0)
        elif strategy == "least_loaded":
            result = Pick(self.least_loaded(candidates), "least_loaded", 0)
        else:
            result = self._affinity(candidates, prompt.hashes, shared)
        self._index.record(result.replica.index, prompt.hashes, prompt.end)
        return result

    def _rotate(self, candidates: list[Replica]) -> Replica:
        """The first candidate at or after the rotation point, cyclically."""
        chosen = min(candidates, key=lambda r: (r.index < self._next, r.index))
        self._next = chosen.index + 1
        return chosen

    def least_loaded(self, candidates: list[Replica]) -> Replica:
        """The least loaded of `candidates` (non-empty); ties rotate."""
        lowest = min(r.load for r in candidates)
        return self._rotate([r for r in candidates if r.load == lowest])

    def _affinity(
        self, candidates: list[Replica], hashes: list[bytes], shared: list[PrefixMatch] | None
    ) -> Pick:
        matches = merge_matches(self._index.match(hashes), shared)
        ending = [r for r in candidates if matches[r.index].at_end]
        if not ending:
            return Pick(self.least_loaded(candidates), "least_loaded", 0)
        best = max(ending, key=lambda r: (matches[r.index].num_blocks, -r.load, -r.index))
        lowest = min(candidates, key=lambda r: r.load)
        if self._imbalanced(best.load, lowest.load):
            coolest = self.least_loaded(candidates)
            return Pick(coolest, "balanced", matches[coolest.index].num_blocks)
        return Pick(best, "affinity", matches[best.index].num_blocks)

    def _imbalanced(self, preferred: int, lowest: int) -> bool:
        s = self._settings
        return (
            preferred - lowest > s.balance_abs_threshold
            and preferred > lowest * s.balance_rel_threshold
        )
