"""The disaggregated prefill/decode half of the engine-state metrics: `DisaggCollector`,
which turns the KV channel's counters and the workers' ticket counters into gauges and
counters at scrape time, and the views of that state it reads (the engine's
`ChannelStats`, `TicketStats` and `WorkerStatus` satisfy them).

Owns the per-phase queue depth, the KV channel and KV ticket families and the worker role
info. Exports nothing in unified mode (no channel, no tickets, every worker `unified`).
Does not own the transfer latency histogram (`inferflux_kv_transfer_seconds`), observed
as each decode worker's `StepStats` arrive (observability/metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Enqueue → hydrated of one KV ticket: 0.5 ms (a short prompt through shared memory) to
# 5 s (a long prompt's state on a loaded machine); fine-grained under 10 ms, the target.
TRANSFER_BUCKETS = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
# The KV channel's counted outcomes (engine `ChannelStats` fields of the same names).
TICKET_OUTCOMES = ("handed_off", "blocked", "direct", "resubmitted")


class ChannelView(Protocol):
    """What the collector reads of a model's KV channel (engine `ChannelStats`)."""

    @property
    def capacity(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def in_flight_bytes(self) -> int: ...
    @property
    def prefill_queue(self) -> int: ...
    @property
    def handed_off(self) -> int: ...
    @property
    def blocked(self) -> int: ...
    @property
    def direct(self) -> int: ...
    @property
    def resubmitted(self) -> int: ...


class TicketsView(Protocol):
    """What the collector reads of a worker's KV tickets (engine `TicketStats`)."""

    @property
    def written(self) -> int: ...
    @property
    def write_seconds_total(self) -> float: ...
    @property
    def written_bytes(self) -> int: ...
    @property
    def hydrated(self) -> int: ...
    @property
    def hydrate_seconds_total(self) -> float: ...
    @property
    def refused(self) -> int: ...


class PoolStatsView(Protocol):
    """What the collector reads of a worker's latest state (engine `EngineStats`)."""

    @property
    def num_waiting(self) -> int: ...
    @property
    def tickets(self) -> TicketsView | None: ...


class PoolWorkerView(Protocol):
    """One worker and its pool (engine `WorkerStatus`)."""

    @property
    def worker_id(self) -> int: ...
    @property
    def role(self) -> str: ...
    @property
    def stats(self) -> PoolStatsView: ...


class DisaggCollector(Collector):
    """Per-phase queue depth, the KV channels (summed over models), the workers' KV
    tickets (summed over workers) and each worker's role; read at scrape time."""

    def __init__(
        self,
        workers: Callable[[], Sequence[PoolWorkerView]],
        channels: Callable[[], Sequence[ChannelView]],
    ) -> None:
        self._workers = workers
        self._channels = channels

    def collect(self) -> Iterator[Metric]:
        workers = self._workers()
        channels = self._channels()
        if channels:
            yield from _channel(channels, workers)
        tickets = [w.stats.tickets for w in workers if w.stats.tickets is not None]
        if tickets:
            yield from _tickets(tickets)
        pooled = [w for w in workers if w.role != "unified"]
        if pooled:
            yield _roles(pooled)


def _channel(
    channels: Sequence[ChannelView], workers: Sequence[PoolWorkerView]
) -> Iterator[Metric]:
    depth = GaugeMetricFamily(
        "inferflux_disagg_queue_depth",
        "Requests waiting per phase: prefill = sent to the prefill pool and not handed off "
        "yet; decode = queued in the decode workers",
        labels=["phase"],
    )
    depth.add_metric(["prefill"], sum(c.prefill_queue for c in channels))
    decode = sum(w.stats.num_waiting for w in workers if w.role == "decode")
    depth.add_metric(["decode"], decode)
    yield depth
    yield GaugeMetricFamily(
        "inferflux_kv_channel_in_flight",
        "KV tickets reserved now: prefilling, written, or waiting to be hydrated",
        value=sum(c.in_flight for c in channels),
    )
    yield GaugeMetricFamily(
        "inferflux_kv_channel_capacity",
        "KV tickets the channel holds at most (scheduler.disaggregated.channel_capacity)",
        value=sum(c.capacity for c in channels),
    )
    yield GaugeMetricFamily(
        "inferflux_kv_channel_bytes",
        "Shared-memory bytes of the KV tickets in flight (estimated before prefill)",
        value=sum(c.in_flight_bytes for c in channels),
    )
    outcomes = CounterMetricFamily(
        "inferflux_kv_tickets",
        "Requests through the KV channel by outcome: handed_off (prefill → decode), "
        "blocked (waited past ticket_wait_s for a full channel), direct (ran on a decode "
        "worker alone), resubmitted (a worker died before the first token)",
        labels=["outcome"],
    )
    for outcome in TICKET_OUTCOMES:
        outcomes.add_metric([outcome], sum(getattr(c, outcome) for c in channels))
    yield outcomes


def _tickets(tickets: Sequence[TicketsView]) -> Iterator[Metric]:
    families = (
        ("inferflux_kv_tickets_written", "KV tickets the prefill workers wrote", "written"),
        (
            "inferflux_kv_ticket_written_bytes",
            "Bytes of the KV tickets the prefill workers wrote",
            "written_bytes",
        ),
        (
            "inferflux_kv_ticket_write_seconds",
            "Seconds the prefill workers spent writing KV tickets",
            "write_seconds_total",
        ),
        ("inferflux_kv_tickets_hydrated", "KV tickets the decode workers loaded", "hydrated"),
        (
            "inferflux_kv_ticket_hydrate_seconds",
            "Seconds the decode workers spent reading and loading KV tickets",
            "hydrate_seconds_total",
        ),
        (
            "inferflux_kv_tickets_refused",
            "KV tickets a decode worker refused (gone, another model or layout); the "
            "prompt was computed again",
            "refused",
        ),
    )
    for name, doc, field in families:
        yield CounterMetricFamily(name, doc, value=sum(getattr(t, field) for t in tickets))


def _roles(workers: Sequence[PoolWorkerView]) -> Metric:
    family = GaugeMetricFamily(
        "inferflux_worker_role_info",
        "Always 1; `role` is the worker's pool (prefill or decode) in disaggregated mode "
        "(join on `worker` with the other per-worker families)",
        labels=["worker", "role"],
    )
    for w in workers:
        family.add_metric([str(w.worker_id), w.role], 1.0)
    return family
