"""Routing inside one server: which engine worker gets a request (`scheduler.routing`).

Owns: the `WorkerRouter` seam and `make_worker_router`, the four strategies
(`round_robin`, `least_loaded`, `memory_aware`, `prefix_affinity`), the KV cells reserved
by requests routed but not finished, and per-worker decision counters. Pure logic, no I/O:
the engine client (engine/client.py) describes its workers as `WorkerLoad`s on every
decision and reports each request's end. Does not own the workers' prefix caches
(scheduler/prefix_cache.py), only an approximate index of them (engine/prefix_index.py).

Workers are named by `worker_id`; the set may grow or shrink between two decisions, and a
worker whose `generation` changed restarted with empty caches. Either way the router
forgets what it knew of it. The strategy and its thresholds are read from the
`SchedulerSettings` passed to each decision, so a live change applies to the next request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inferflux.config.settings import SchedulerSettings
from inferflux.engine.prefix_index import BLOCK_TOKENS, PrefixIndex, block_hashes
from inferflux.errors import NoWorkerReady, QueueFull

# Blocks indexed per worker when its cache size is not known yet (no stats so far).
_DEFAULT_CAPACITY_BLOCKS = 4096


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker as a routing decision sees it (from the engine client's state)."""

    worker_id: int
    generation: int
    ready: bool
    num_in_flight: int  # requests sent and not finished (queued in the worker included)
    kv_cells_used: int = 0  # from the worker's latest EngineStats
    kv_cells_total: int = 0  # 0 = not reported yet
    cache_max_tokens: int = 0  # the worker's prefix-cache token budget; 0 = off or unknown


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing reads of a generation request."""

    request_id: str
    token_ids: Sequence[int]  # the prompt
    max_tokens: int
    namespace: str = ""  # prefix-cache namespace (tenant / adapter)


@dataclass(frozen=True, slots=True)
class Route:
    """A decision: the worker, and why (`outcome`, a label of a small fixed set)."""

    worker_id: int
    strategy: str
    outcome: str  # affinity | balanced | least_loaded | round_robin | memory_aware
    matched_tokens: int = 0  # prefix_affinity: tokens the chosen worker is known to hold


@dataclass(frozen=True, slots=True)
class WorkerRouting:
    """A worker's routing counters since it joined: decisions by (strategy, outcome),
    prompt tokens routed to it because it held them, and its indexed prefix blocks."""

    decisions: dict[tuple[str, str], int]
    affinity_tokens: int
    indexed_blocks: int


class WorkerRouter(Protocol):
    """Picks workers; remembers what it sent where until each request finishes."""

    def route(
        self, request: RouteRequest, workers: Sequence[WorkerLoad], policy: SchedulerSettings
    ) -> Route:
        """Pick a worker by `policy.routing` and count the decision. Remembers the
        request there (prefix blocks, reserved KV cells) until `finish`. Raises
        NoWorkerReady when no worker is ready, QueueFull when `memory_aware` finds none
        with room."""
        ...

    def route_any(self, workers: Sequence[WorkerLoad]) -> int:
        """The least-loaded ready worker (embeddings: no prefix, no KV estimate)."""
        ...

    def finish(self, request_id: str, cached_token_ids: Sequence[int] | None) -> None:
        """The request ended: release its reservation. `cached_token_ids`: the tokens its
        worker now caches (prompt + output), None when it caches nothing more."""
        ...

    def stats(self, worker_id: int) -> WorkerRouting:
        """The counters of one worker (zeros for one never seen)."""
        ...


@dataclass(slots=True)
class _Routed:
    worker_id: int
    namespace: str
    hashes: list[int] | None  # None: routed by a strategy that does not index prefixes
    cells: int


@dataclass(slots=True)
class _WorkerState:
    generation: int
    capacity_blocks: int = _DEFAULT_CAPACITY_BLOCKS
    reserved_cells: int = 0
    affinity_tokens: int = 0
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)


class PoolRouter:
    """`WorkerRouter` over one model's workers (see the module docstring)."""

    def __init__(self) -> None:
        self._index = PrefixIndex()
        self._workers: dict[int, _WorkerState] = {}
        self._routed: dict[str, _Routed] = {}
        self._last_round_robin = -1

    # -- decisions ---------------------------------------------------------------------
    def route(
        self, request: RouteRequest, workers: Sequence[WorkerLoad], policy: SchedulerSettings
    ) -> Route:
        ready = self._ready(workers)
        strategy = policy.routing
        hashes: list[int] | None = None
        if strategy == "prefix_affinity":
            hashes = block_hashes(request.namespace, request.token_ids)
            route = self._prefix_affinity(hashes, ready, policy)
        elif strategy == "memory_aware":
            route = self._memory_aware(request, ready)
        elif strategy == "round_robin":
            route = Route(self._round_robin(ready), strategy, "round_robin")
        else:
            route = Route(_least_loaded(ready).worker_id, strategy, "least_loaded")
        self._record(request, route, hashes, ready)
        return route

    def route_any(self, workers: Sequence[WorkerLoad]) -> int:
        return _least_loaded(self._ready(workers)).worker_id

    def _ready(self, workers: Sequence[WorkerLoad]) -> list[WorkerLoad]:
        """The ready workers, after forgetting workers that left or restarted."""
        self._sync(workers)
        ready = [w for w in workers if w.ready]
        if not ready:
            raise NoWorkerReady("no engine worker is ready; retry shortly")
        return ready

    def _prefix_affinity(
        self, hashes: list[int], ready: list[WorkerLoad], policy: SchedulerSettings
    ) -> Route:
        """The worker known to hold the longest prefix of the prompt (ties: the least
        loaded), unless that prefix is shorter than `affinity_min_match_tokens` (then the
        least-loaded worker), or the worker is overloaded: more requests in flight than
        the least loaded one's plus `balance_abs_threshold` AND more than
        `balance_rel_threshold` times it (then the least-loaded worker, so a hot prefix
        cannot pull all traffic onto one worker)."""
        strategy = "prefix_affinity"
        best = max(ready, key=lambda w: (self._index.match(w.worker_id, hashes), -w.num_in_flight))
        matched = self._index.match(best.worker_id, hashes) * BLOCK_TOKENS
        least = _least_loaded(ready)
        if matched < policy.affinity_min_match_tokens:
            return Route(least.worker_id, strategy, "least_loaded")
        low, load = least.num_in_flight, best.num_in_flight
        if load > low + policy.balance_abs_threshold and load > low * policy.balance_rel_threshold:
            return Route(least.worker_id, strategy, "balanced")
        return Route(best.worker_id, strategy, "affinity", matched)

    def _memory_aware(self, request: RouteRequest, ready: list[WorkerLoad]) -> Route:
        """The worker with the most free KV cells, if it has room for prompt + max_tokens.
        Free = cells for running sequences (total minus the prefix cache's budget) minus
        what is in use or reserved by requests routed there and not finished (the larger;
        stats lag behind routing). A worker that has not reported its cells yet counts as
        empty."""
        need = len(request.token_ids) + request.max_tokens
        best = max(ready, key=lambda w: (self._free_cells(w), -w.num_in_flight))
        free = self._free_cells(best)
        if free < need:
            self._count(best.worker_id, "memory_aware", "refused")
            raise QueueFull(
                f"no engine worker has {need} free KV cells for this request (prompt + "
                f"max_tokens; the most free: {int(free)}, scheduler.routing memory_aware); "
                "retry later or lower max_tokens"
            )
        return Route(best.worker_id, "memory_aware", "memory_aware")

    def _free_cells(self, worker: WorkerLoad) -> float:
        if worker.kv_cells_total <= 0:
            return float("inf")
        state = self._workers[worker.worker_id]
        capacity = worker.kv_cells_total - worker.cache_max_tokens
        return capacity - max(worker.kv_cells_used, state.reserved_cells)

    def _round_robin(self, ready: list[WorkerLoad]) -> int:
        """The next ready worker id after the last one picked, wrapping around (workers
        that joined or left in between change nothing)."""
        ids = sorted(w.worker_id for w in ready)
        after = [i for i in ids if i > self._last_round_robin]
        self._last_round_robin = after[0] if after else ids[0]
        return self._last_round_robin

    # -- bookkeeping -------------------------------------------------------------------
    def _record(
        self,
        request: RouteRequest,
        route: Route,
        hashes: list[int] | None,
        ready: list[WorkerLoad],
    ) -> None:
        self.finish(request.request_id, None)  # a resubmission replaces the earlier one
        worker = next(w for w in ready if w.worker_id == route.worker_id)
        state = self._workers[worker.worker_id]
        state.decisions[(route.strategy, route.outcome)] += 1
        state.affinity_tokens += route.matched_tokens
        state.capacity_blocks = _capacity(worker)
        cells = len(request.token_ids) + request.max_tokens
        state.reserved_cells += cells
        self._routed[request.request_id] = _Routed(
            worker.worker_id, request.namespace, hashes, cells
        )
        if hashes:
            self._index.insert(worker.worker_id, hashes, capacity=state.capacity_blocks)

    def finish(self, request_id: str, cached_token_ids: Sequence[int] | None) -> None:
        routed = self._routed.pop(request_id, None)
        if routed is None:
            return
        state = self._workers.get(routed.worker_id)
        if state is None:
            return  # the worker left or restarted: nothing of it is remembered
        state.reserved_cells -= routed.cells
        if cached_token_ids is not None and routed.hashes is not None:
            hashes = block_hashes(routed.namespace, cached_token_ids, prefix=routed.hashes)
            self._index.insert(routed.worker_id, hashes, capacity=state.capacity_blocks)

    def _sync(self, workers: Sequence[WorkerLoad]) -> None:
        """Forget workers that are gone or restarted (new generation: empty caches)."""
        present = {w.worker_id: w.generation for w in workers}
        for worker_id in [i for i, s in self._workers.items() if present.get(i) != s.generation]:
            self._drop(worker_id)
        for worker_id, generation in present.items():
            self._workers.setdefault(worker_id, _WorkerState(generation))

    def _drop(self, worker_id: int) -> None:
        del self._workers[worker_id]
        self._index.forget(worker_id)
        for request_id in [r for r, v in self._routed.items() if v.worker_id == worker_id]:
            del self._routed[request_id]

    def _count(self, worker_id: int, strategy: str, outcome: str) -> None:
        self._workers[worker_id].decisions[(strategy, outcome)] += 1

    def stats(self, worker_id: int) -> WorkerRouting:
        state = self._workers.get(worker_id)
        if state is None:
            return WorkerRouting(decisions={}, affinity_tokens=0, indexed_blocks=0)
        return WorkerRouting(
            decisions=dict(state.decisions),
            affinity_tokens=state.affinity_tokens,
            indexed_blocks=self._index.num_blocks(worker_id),
        )


def _least_loaded(ready: list[WorkerLoad]) -> WorkerLoad:
    """Fewest requests in flight; ties go to the lowest worker id."""
    return min(ready, key=lambda w: (w.num_in_flight, w.worker_id))


def _capacity(worker: WorkerLoad) -> int:
    """Blocks worth indexing for `worker`: its prefix cache holds at most
    `cache_max_tokens` tokens (else its KV cells bound it)."""
    tokens = worker.cache_max_tokens or worker.kv_cells_total
    return max(tokens // BLOCK_TOKENS, 1) if tokens else _DEFAULT_CAPACITY_BLOCKS


def make_worker_router() -> WorkerRouter:
    """A router for one model's workers (the strategy is read at each decision)."""
    return PoolRouter()
