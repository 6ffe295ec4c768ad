"""Health and load of the replicas, read periodically.

Owns: `HealthMonitor`, which every `health_interval_s` asks each replica's `/readyz`
(200: healthy) and reads its load from `/metrics` (`inferflux_scheduler_queue_depth`,
`inferflux_running_sequences`, `inferflux_kv_usage_ratio`; public on a replica unless
`observability.metrics.public: false`, then `stats_api_key` is sent). A replica is
ejected after `eject_after_failures` consecutive failed checks and re-admitted by the
first passing one; a replica that did not answer those checks at all (hung: SIGSTOP, a
dead host) also has its open streams ended (`Forwarder.cut_streams`), while one that
answered 503 (draining) keeps them. Does not own: ejecting on a live request's connect error
(`proxy.py` calls `Replica.eject` directly).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from inferflux.config.router_settings import RouterSettings
from inferflux.router.periodic import Periodic
from inferflux.router.replicas import Replica

logger = logging.getLogger(__name__)

_LOAD_GAUGES = (
    "inferflux_scheduler_queue_depth",
    "inferflux_running_sequences",
    "inferflux_kv_usage_ratio",
)


def read_load(text: str) -> dict[str, float]:
    """Sum each load gauge over its label sets (max for the KV ratio) from a Prometheus
    text exposition. Only the lines of those three gauges are looked at."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(_LOAD_GAUGES):
            continue
        head, _, value_text = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name not in _LOAD_GAUGES:  # a longer name: ..._queue_depth_by_priority
            continue
        try:
            value = float(value_text)
        except ValueError:
            continue
        if name == "inferflux_kv_usage_ratio":
            values[name] = max(values.get(name, 0.0), value)
        else:
            values[name] = values.get(name, 0.0) + value
    return values


class HealthMonitor:
    """Checks every replica every `health_interval_s` on its own task. `on_change` is
    called with the replica after an ejection or an admission (for metrics, the index)."""

    def __init__(
        self,
        replicas: list[Replica],
        clients: list[httpx.AsyncClient],
        settings: RouterSettings,
        on_change: Callable[[Replica, bool], None],
        on_unreachable: Callable[[Replica], None],
    ) -> None:
        self._replicas = replicas
        self._clients = clients
        self._settings = settings
        self._on_change = on_change
        self._on_unreachable = on_unreachable
        self._periodic = Periodic(
            "router-health", lambda: self._settings.health_interval_s, self.check_all
        )
        self._headers = (
            {"authorization": f"Bearer {settings.stats_api_key.get_secret_value()}"}
            if settings.stats_api_key is not None
            else {}
        )

    async def check_all(self) -> None:
        """One round of checks, all replicas at once."""
        await asyncio.gather(*(self._check(r) for r in self._replicas if not r.retired))

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def _check(self, replica: Replica) -> None:
        client = self._clients[replica.index]
        timeout = self._settings.health_timeout_s
        try:
            ready = await client.get("/readyz", timeout=timeout)
            metrics = await client.get("/metrics", headers=self._headers, timeout=timeout)
        except httpx.HTTPError as exc:
            self._failed(replica, f"health check: {type(exc).__name__}", unreachable=True)
            return
        if ready.status_code != 200:  # draining, say: its open streams go on
            self._failed(replica, f"/readyz answered {ready.status_code}", unreachable=False)
            return
        if metrics.status_code == 200:
            load = read_load(metrics.text)
            replica.queue_depth = int(load.get(_LOAD_GAUGES[0], 0))
            replica.num_running = int(load.get(_LOAD_GAUGES[1], 0))
            replica.kv_usage = load.get(_LOAD_GAUGES[2], 0.0)
        if replica.admit():
            self._on_change(replica, True)

    def _failed(self, replica: Replica, reason: str, *, unreachable: bool) -> None:
        """Count a failed check. At `eject_after_failures` the replica leaves rotation,
        and when it did not answer at all (hung, dead, cut off) its open streams end."""
        replica.num_failures += 1
        replica.last_error = reason
        if replica.num_failures < self._settings.eject_after_failures:
            return
        if replica.eject(reason):
            self._on_change(replica, False)
        if unreachable:
            self._on_unreachable(replica)
