"""Replicas found through DNS (`router.replica_dns`): a Kubernetes headless Service.

Owns: `ReplicaDiscovery`, which resolves `HOST:PORT` every `replica_dns_interval_s` and
hands the addresses found (`http://IP:PORT`, one per record) to a callback that makes
them the discovered replicas (`RouterApp.sync_replicas`). A lookup that fails keeps the
last set (a DNS blip must not empty the rotation). Does not own: health (a discovered
replica enters rotation after its first passing check) or what leaving means.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from inferflux.router.periodic import Periodic

logger = logging.getLogger(__name__)


def replica_url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"{scheme}://{host}:{port}"


class ReplicaDiscovery:
    """Resolves `dns_url` (`scheme://host:port`) periodically on its own task."""

    def __init__(
        self,
        dns_url: str,
        interval_s: float,
        on_found: Callable[[list[str]], Awaitable[None]],
    ) -> None:
        parts = urlsplit(dns_url)
        self._scheme = parts.scheme
        self._host = parts.hostname or ""
        self._port = parts.port or 80
        self._interval_s = interval_s
        self._on_found = on_found
        self._periodic = Periodic("router-discovery", lambda: self._interval_s, self.refresh)

    async def resolve(self) -> list[str] | None:
        """The replica URLs the name resolves to now, sorted; None when the lookup fails."""
        loop = asyncio.get_running_loop()
        try:
            records = await loop.getaddrinfo(
                self._host, self._port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
        except OSError as exc:
            logger.warning("replica_dns %s: lookup failed (%s)", self._host, exc)
            return None
        addresses = {str(record[4][0]) for record in records}
        return sorted(replica_url(self._scheme, a, self._port) for a in addresses)

    async def refresh(self) -> None:
        found = await self.resolve()
        if found is not None:
            await self._on_found(found)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
