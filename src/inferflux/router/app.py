"""The router's ASGI app: its own probes, stats and metrics; everything else proxied.

Owns: `RouterApp` (pure ASGI): the lifespan (one pooled `httpx.AsyncClient` per replica,
a first round of health checks, the `HealthMonitor`), `GET /livez` and `/healthz` (the
process is up), `/readyz` (200 while at least one replica is in rotation), `/router/stats`
(replicas, health, load, counters), `/metrics` (the router's own Prometheus metrics).
Every other HTTP request goes to `Forwarder`, every WebSocket (the Responses API's
WebSocket mode) to `relay_websocket`.
The router does no authentication: replicas enforce everything, so its own routes carry
nothing secret: no prompts, no credentials (a replica URL's userinfo and query string
are redacted in /router/stats, as in every log line). They do show the replicas'
addresses: bind the router where only clients and operators reach it.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import msgspec
from prometheus_client import generate_latest
from starlette.types import Receive, Scope, Send

from inferflux.config.router_settings import RouterSettings
from inferflux.observability.logging import redact_url
from inferflux.observability.router_metrics import RouterMetrics
from inferflux.router.directory import SharedDirectory
from inferflux.router.discovery import ReplicaDiscovery
from inferflux.router.health import HealthMonitor
from inferflux.router.prefix_index import PrefixIndex
from inferflux.router.proxy import Forwarder
from inferflux.router.replicas import Replica, ReplicaPicker
from inferflux.router.websocket import relay_websocket

logger = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_LOCAL_PATHS = frozenset({"/livez", "/healthz", "/readyz", "/router/stats", "/metrics"})
_POOL_CONNECTIONS = 256  # per replica; a stream holds one for its whole length
_encoder = msgspec.json.Encoder()


class RouterApp:
    """`inferflux router` as an ASGI app. Build it with the settings; uvicorn (or a test's
    ASGI transport with lifespan) starts it."""

    def __init__(
        self, settings: RouterSettings, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        """`transport`: how the replicas are reached (default: TCP); unit tests of the
        routing logic pass a mock one."""
        self.settings = settings
        self._transport = transport
        self.replicas = [Replica(i, url) for i, url in enumerate(settings.replicas)]
        self.index = PrefixIndex(len(self.replicas), settings.affinity_max_blocks)
        self.picker = ReplicaPicker(settings, self.index)
        self.metrics = RouterMetrics()
        self.clients: list[httpx.AsyncClient] = []
        self._forwarder: Forwarder | None = None
        self.directory: SharedDirectory | None = None
        self._health: HealthMonitor | None = None
        self._discovery: ReplicaDiscovery | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "websocket":
            replica = self._websocket_replica()
            timeout_s = self.settings.connect_timeout_s
            await relay_websocket(scope, receive, send, replica, timeout_s)
        elif scope["path"] in _LOCAL_PATHS and scope["method"] in ("GET", "HEAD"):
            await self._local(scope["path"], send)
        elif self._forwarder is not None:
            await self._forwarder.forward(scope, receive, send)

    async def startup(self) -> None:
        """Open the connection pools, find and check every replica once, start polling."""
        s = self.settings
        self.clients.extend(self._client(r.url) for r in self.replicas)
        self.directory = SharedDirectory.from_settings(s)
        self._forwarder = Forwarder(
            s,
            self.replicas,
            self.clients,
            self.picker,
            self.metrics,
            self._ejected,
            self.directory,
        )
        self._health = HealthMonitor(
            self.replicas, self.clients, s, self._health_changed, self._unreachable
        )
        for replica in self.replicas:
            self.metrics.healthy.labels(str(replica.index)).set(0)
        if s.replica_dns is not None:
            self._discovery = ReplicaDiscovery(
                s.replica_dns, s.replica_dns_interval_s, self.sync_replicas
            )
            await self._discovery.refresh()
            self._discovery.start()
        await self._health.check_all()
        self._health.start()

    async def shutdown(self) -> None:
        if self._discovery is not None:
            await self._discovery.stop()
        if self._health is not None:
            await self._health.stop()
        for client in self.clients:
            await client.aclose()
        if self.directory is not None:
            await self.directory.close()

    async def sync_replicas(self, found: list[str]) -> None:
        """Make `found` (replica_dns's addresses) plus `router.replicas` the replicas.

        One that is gone is retired: out of rotation and no longer checked, its open
        streams left to finish (a pod leaving a headless Service is draining). One that
        is new takes a retired slot with nothing in flight, else a new index (so metric
        labels stay few), and enters rotation at its first passing health check."""
        wanted = set(found) | set(self.settings.replicas)
        for replica in self.replicas:
            if not replica.retired and replica.url not in wanted:
                replica.retired, replica.healthy = True, False
                self.index.forget(replica.index)
                self.metrics.healthy.labels(str(replica.index)).set(0)
                logger.info("replica %d (%s) left replica_dns", replica.index, replica.url)
        present = {r.url for r in self.replicas if not r.retired}
        for url in sorted(wanted - present):
            await self._add_replica(url)

    async def _add_replica(self, url: str) -> None:
        slot = next((r for r in self.replicas if r.retired and not r.num_in_flight), None)
        if slot is None:
            self.index.add_replica()
            slot = Replica(len(self.replicas), url)
            self.replicas.append(slot)
            self.clients.append(self._client(url))
        else:
            old = self.clients[slot.index]
            self.clients[slot.index] = self._client(url)
            await old.aclose()
            slot.reuse(url)
            self.index.forget(slot.index)
        self.metrics.healthy.labels(str(slot.index)).set(0)
        logger.info("replica %d (%s) found through replica_dns", slot.index, url)

    def _client(self, url: str) -> httpx.AsyncClient:
        s = self.settings
        return httpx.AsyncClient(
            base_url=url,
            timeout=httpx.Timeout(s.read_timeout_s, connect=s.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=_POOL_CONNECTIONS, max_keepalive_connections=_POOL_CONNECTIONS
            ),
            trust_env=False,
            transport=self._transport,
        )

    def stats(self) -> dict[str, Any]:  # Any: a JSON document
        """What GET /router/stats answers."""
        return {
            "routing": self.settings.routing,
            "replicas": [
                {
                    "index": r.index,
                    "url": redact_url(r.url),
                    "healthy": r.healthy,
                    "retired": r.retired,
                    "load": r.load,
                    "in_flight": r.num_in_flight,
                    "queue_depth": r.queue_depth,
                    "running": r.num_running,
                    "kv_usage": r.kv_usage,
                    "requests": r.num_requests,
                    "ejections": r.num_ejections,
                    "consecutive_failures": r.num_failures,
                    "last_error": r.last_error,
                    "affinity_blocks": self.index.size(r.index),
                }
                for r in self.replicas
            ],
            "decisions": _counter_values(self.metrics, "inferflux_router_routing_decisions"),
            "retries": _counter_values(self.metrics, "inferflux_router_retries"),
            "shared_directory": self.directory is not None,
        }

    def _websocket_replica(self) -> Replica | None:
        """The least loaded healthy replica (ties rotate), for a new WebSocket."""
        healthy = [r for r in self.replicas if r.healthy]
        if not healthy:
            return None
        return self.picker.least_loaded(healthy)

    def _unreachable(self, replica: Replica) -> None:
        if self._forwarder is not None and self._forwarder.cut_streams(replica):
            logger.warning("replica %d does not answer: its open streams were ended", replica.index)

    def _ejected(self, replica: Replica) -> None:
        self._health_changed(replica, False)

    def _health_changed(self, replica: Replica, healthy: bool) -> None:
        label = str(replica.index)
        self.metrics.healthy.labels(label).set(1 if healthy else 0)
        if not healthy:
            self.metrics.ejections.labels(label).inc()
            self.index.forget(replica.index)  # its prefix cache is gone or going

    async def _local(self, path: str, send: Send) -> None:
        if path == "/metrics":
            await _respond(send, 200, generate_latest(self.metrics.registry), METRICS_CONTENT_TYPE)
            return
        if path == "/router/stats":
            body: dict[str, Any] = self.stats()  # Any: a JSON document
            status = 200
        elif path == "/readyz":
            num_healthy = sum(r.healthy for r in self.replicas)
            status = 200 if num_healthy else 503
            body = {
                "status": "ready" if num_healthy else "no replica ready",
                "replicas_healthy": num_healthy,
                "replicas": len(self.replicas),
            }
        else:
            body, status = {"status": "alive"}, 200
        await _respond(send, status, _encoder.encode(body), b"application/json")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _respond(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _counter_values(metrics: RouterMetrics, name: str) -> dict[str, float]:
    """A labelled counter's values by its one label (for /router/stats)."""
    values: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                values[next(iter(sample.labels.values()))] = sample.value
    return values
