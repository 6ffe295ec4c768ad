"""The gRPC server of one app: inferflux.v1 (`bridge.py`), health and reflection.

Owns `GrpcServer` and `start_grpc_server`, which the app's lifespan calls when
`server.grpc_port` is set: a `grpc.aio` server on server.host:grpc_port in the app's
event loop, with TLS from `server.tls` when it is on. The standard `grpc.health.v1`
service says SERVING while the default model has a ready worker and NOT_SERVING before
that, and from the moment the server starts draining. Server reflection lists the three
services. `stop` lets calls in flight finish for a short grace, then cancels them (their
generations are aborted like those of a client that went away).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from starlette.types import ASGIApp

from inferflux.api.grpc.bridge import AsgiBridge
from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.config.settings import ServerSettings
from inferflux.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["GrpcServer", "start_grpc_server"]

STOP_GRACE_S = 5.0
HEALTH_POLL_S = 0.5
_SLACK_BYTES = 64 * 1024  # a body just over the app's limit still reaches it (413, audited)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Inference"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class GrpcServer:
    """A started gRPC server and the task that keeps its health status current."""

    def __init__(
        self, server: grpc.aio.Server, health_servicer: health.aio.HealthServicer, port: int
    ) -> None:
        self.server = server
        self.health = health_servicer
        self.port = port
        self._watch: asyncio.Task[None] | None = None

    def watch(self, is_ready: Callable[[], bool]) -> None:
        self._watch = asyncio.create_task(self._keep_health(is_ready), name="grpc-health")

    async def _keep_health(self, is_ready: Callable[[], bool]) -> None:
        serving = None
        while True:
            now = is_ready()
            if now != serving:
                serving = now
                status = _SERVING if now else _NOT_SERVING
                for name in ("", SERVICE_NAME):
                    await self.health.set(name, status)
            await asyncio.sleep(HEALTH_POLL_S)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """NOT_SERVING at once, then stop taking calls; calls in flight get `grace_s`."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        logger.info("gRPC server stopped")


def _address(settings: ServerSettings, port: int) -> str:
    host = settings.host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _credentials(settings: ServerSettings) -> grpc.ServerCredentials | None:
    tls = settings.tls
    if not tls.enabled:
        return None
    key = Path(str(tls.key_path)).read_bytes()
    chain = Path(str(tls.cert_path)).read_bytes()
    return grpc.ssl_server_credentials([(key, chain)])


def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        if credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, credentials)
    except RuntimeError:
        raise ConfigError(
            f"server.grpc_port: cannot listen on {address} (the port is in use, or the host "
            "is not an address of this machine); pick another port"
        ) from None


async def start_grpc_server(
    app: ASGIApp, settings: ServerSettings, is_ready: Callable[[], bool]
) -> GrpcServer:
    """Serve `app`'s inferflux.v1 API on `settings.grpc_port` (which must be set).
    Raises ConfigError when the port cannot be bound."""
    assert settings.grpc_port is not None
    credentials = _credentials(settings)
    limit = settings.max_request_bytes + _SLACK_BYTES
    # NOTE: no SO_REUSEPORT (gRPC's default): a second server on the port must fail, not
    # silently share the calls
    options = [("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((AsgiBridge(app).handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    address = _address(settings, settings.grpc_port)
    port = _bind(server, address, credentials)
    await server.start()
    started = GrpcServer(server, health_servicer, port)
    started.watch(is_ready)
    logger.info("gRPC (%s) on %s%s", SERVICE_NAME, address, " with TLS" if credentials else "")
    return started
