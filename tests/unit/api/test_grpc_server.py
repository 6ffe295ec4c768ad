"""The gRPC server and bridge over a small ASGI app (no model): health before and after
ready and while stopping, statuses and trailers of HTTP errors and of an error frame
mid-stream, an app that fails, and a cancelled call reaching the app as
`http.disconnect`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import msgspec
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from starlette.types import Receive, Scope, Send

from inferflux.api.grpc import GrpcServer, start_grpc_server
from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.grpc.render import ERROR_FLAG, frame
from inferflux.config.settings import ServerSettings
from inferflux.errors import ConfigError, RateLimited
from tests.integration.server_process import free_port

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ScriptedApp:
    """Answers each method as the test says; records scopes and what `receive` gave."""

    def __init__(self) -> None:
        self.scopes: list[Scope] = []
        self.disconnected = asyncio.Event()
        self.cut = False  # Chat ends after a delta, without its finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        body = (await receive())["body"]
        method = scope["path"].rsplit("/", 1)[1]
        await getattr(self, method)(body, receive, send)

    async def ListModels(self, body: bytes, receive: Receive, send: Send) -> None:  # noqa: N802
        error = RateLimited("slow down", retry_after_s=2.5)
        payload = msgspec.json.encode(error.to_body())
        headers = [(b"retry-after", b"3"), (b"x-request-id", b"r-1")]
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def Generate(self, body: bytes, receive: Receive, send: Send) -> None:  # noqa: N802
        error = b'{"status": 503, "error": {"message": "worker died", "code": "engine_error"}}'
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": frame(b""), "more_body": True})
        await send({"type": "http.response.body", "body": frame(error, ERROR_FLAG)})

    async def Chat(self, body: bytes, receive: Receive, send: Send) -> None:  # noqa: N802
        await send({"type": "http.response.start", "status": 200, "headers": []})
        delta = pb.ChatResponse(delta="Hel").SerializeToString()
        await send({"type": "http.response.body", "body": frame(delta), "more_body": not self.cut})
        if self.cut:
            return
        assert (await receive())["type"] == "http.disconnect"
        self.disconnected.set()

    async def Embed(self, body: bytes, receive: Receive, send: Send) -> None:  # noqa: N802
        raise RuntimeError("a bug")


@pytest.fixture
async def served() -> AsyncIterator[tuple[ScriptedApp, GrpcServer, grpc.aio.Channel, list[bool]]]:
    app, ready = ScriptedApp(), [False]
    settings = ServerSettings(grpc_port=free_port())
    server = await start_grpc_server(app, settings, lambda: ready[0])
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{settings.grpc_port}")
    try:
        yield app, server, channel, ready
    finally:
        await channel.close()
        await server.stop(0)


async def _status(channel: grpc.aio.Channel) -> int:
    health = health_pb2_grpc.HealthStub(channel)
    return (await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)).status


async def test_health_follows_readiness_and_the_stop(served):
    _, server, channel, ready = served
    await asyncio.sleep(0.1)
    assert await _status(channel) == NOT_SERVING
    ready[0] = True
    await asyncio.sleep(0.7)
    assert await _status(channel) == SERVING
    await server.health.enter_graceful_shutdown()
    assert await _status(channel) == NOT_SERVING


async def test_an_http_error_becomes_a_status_with_trailers(served):
    app, _, channel, _ = served
    call = channel.unary_unary("/inferflux.v1.Inference/ListModels")
    metadata = (("authorization", "Bearer k"), ("x-request-id", "r-1"), ("cookie", "no"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(b"", metadata=metadata, timeout=5)
    error = caught.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == "slow down"
    trailers = dict(error.trailing_metadata() or ())
    assert trailers["inferflux-error-code"] == "rate_limit_exceeded"
    assert trailers["retry-after"] == "3" and trailers["x-request-id"] == "r-1"
    scope = app.scopes[-1]
    assert scope["path"] == "/grpc/inferflux.v1.Inference/ListModels"
    assert "inferflux.grpc" in scope["extensions"]
    headers = dict(scope["headers"])
    assert headers[b"authorization"] == b"Bearer k" and b"cookie" not in headers
    assert scope["client"][0] == "127.0.0.1"


async def test_an_error_frame_ends_the_stream_with_its_status(served):
    _, _, channel, _ = served
    call = channel.unary_stream("/inferflux.v1.Inference/Generate")(b"", timeout=5)
    assert await call.read() == b""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "worker died"


async def test_an_app_that_fails_is_internal(served):
    _, _, channel, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await channel.unary_unary("/inferflux.v1.Inference/Embed")(b"", timeout=5)
    assert caught.value.code() == grpc.StatusCode.INTERNAL


async def test_a_cancelled_call_reaches_the_app_as_a_disconnect(served):
    app, _, channel, _ = served
    call = channel.unary_stream("/inferflux.v1.Inference/Chat")(b"", timeout=5)
    assert await call.read()
    call.cancel()
    await asyncio.wait_for(app.disconnected.wait(), 5)


async def test_a_port_in_use_is_a_clear_error(served):
    _, server, _, _ = served
    with pytest.raises(ConfigError, match="server.grpc_port: cannot listen on 127.0.0.1:"):
        await start_grpc_server(ScriptedApp(), ServerSettings(grpc_port=server.port), lambda: True)


async def test_a_stream_cut_before_its_finish_is_internal(served):
    app, _, channel, _ = served
    app.cut = True
    call = channel.unary_stream("/inferflux.v1.Inference/Chat")(b"", timeout=5)
    assert pb.ChatResponse.FromString(await call.read()).delta == "Hel"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INTERNAL
