"""The Prometheus metrics of `inferflux router` (its own process, its own registry).

Owns: `RouterMetrics`. Kept apart from `metrics.py` (one API process's metrics) because
the router is a separate program that shares none of them. Labels are bounded: `replica`
is the replica's index in `router.replicas` (never its URL), `status` the HTTP status,
`reason`/`decision` small fixed sets. docs/scaling.md lists every metric.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The router's own part of a request: 0.1 ms to 1 s.
ADDED_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class RouterMetrics:
    """Every metric of one router, on its own registry (tests build several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "inferflux_router_requests_total",
            "Requests answered through a replica, by replica and the replica's status",
            ["replica", "status"],
            registry=r,
        )
        self.retries = Counter(
            "inferflux_router_retries_total",
            "Requests tried again on another replica, by why (connect_error, unavailable)",
            ["reason"],
            registry=r,
        )
        self.ejections = Counter(
            "inferflux_router_ejections_total",
            "Times a replica was taken out of rotation",
            ["replica"],
            registry=r,
        )
        self.stream_errors = Counter(
            "inferflux_router_stream_errors_total",
            "Responses cut by their replica after the first byte (ended with an error event)",
            ["replica"],
            registry=r,
        )
        self.decisions = Counter(
            "inferflux_router_routing_decisions_total",
            "Replica choices by kind: affinity, balanced, least_loaded, round_robin",
            ["decision"],
            registry=r,
        )
        self.unavailable = Counter(
            "inferflux_router_unavailable_total",
            "Requests answered 503 by the router itself (no healthy replica left)",
            registry=r,
        )
        self.healthy = Gauge(
            "inferflux_router_replica_healthy",
            "1 while the replica is in rotation",
            ["replica"],
            registry=r,
        )
        self.in_flight = Gauge(
            "inferflux_router_replica_in_flight",
            "Requests this router has open on the replica",
            ["replica"],
            registry=r,
        )
        self.added_latency = Histogram(
            "inferflux_router_added_latency_seconds",
            "Time the router adds to a request: reading and routing it before the replica "
            "is asked, plus relaying the replica's response head",
            buckets=ADDED_LATENCY_BUCKETS,
            registry=r,
        )
