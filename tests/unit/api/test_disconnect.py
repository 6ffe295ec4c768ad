"""A client that goes away closes the engine's iterator (which aborts the request)."""

from __future__ import annotations

import json

import anyio
from fastapi import FastAPI
from starlette.types import Message

from tests.fakes.engine import FakeEngineClient


class Client:
    """Drives the ASGI app by hand: sends one JSON body, disconnects on demand."""

    def __init__(self, body: dict[str, object]) -> None:
        self.body = json.dumps(body).encode()
        self.sent_body = False
        self.gone = anyio.Event()
        self.messages: list[Message] = []

    async def receive(self) -> Message:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    def scope(self, path: str) -> dict[str, object]:
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1234),
            "server": ("127.0.0.1", 80),
        }


async def wait_for(condition: object, timeout_s: float = 5.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.005)


async def test_disconnect_mid_stream_closes_engine_iterator(
    app: FastAPI, engine: FakeEngineClient
) -> None:
    engine.hang_after = 2
    client = Client({"prompt": "x", "stream": True})
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(app, client.scope("/v1/completions"), client.receive, client.send)
        await wait_for(lambda: len(client.messages) >= 3)  # start + 2 text chunks
        assert not engine.closed
        client.gone.set()
    assert engine.closed == [engine.requests[0].request_id]


async def test_disconnect_before_first_token_closes_engine_iterator(
    app: FastAPI, engine: FakeEngineClient
) -> None:
    engine.hang_after = 0
    client = Client({"messages": [{"role": "user", "content": "x"}], "stream": True})
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(
            app, client.scope("/v1/chat/completions"), client.receive, client.send
        )
        await wait_for(lambda: bool(engine.requests))
        client.gone.set()
    assert engine.closed == [engine.requests[0].request_id]
    assert client.messages[0]["status"] == 499


async def test_disconnect_during_non_streaming_request_closes_engine_iterator(
    app: FastAPI, engine: FakeEngineClient
) -> None:
    engine.hang_after = 2
    client = Client({"prompt": "x"})
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(app, client.scope("/v1/completions"), client.receive, client.send)
        await wait_for(lambda: bool(engine.requests))
        await anyio.sleep(0.05)
        assert not engine.closed
        client.gone.set()
    assert engine.closed == [engine.requests[0].request_id]


async def test_disconnect_mid_stream_closes_every_choice(
    app: FastAPI, engine: FakeEngineClient
) -> None:
    engine.hang_after = 2
    client = Client({"prompt": "x", "stream": True, "n": 3})
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(app, client.scope("/v1/completions"), client.receive, client.send)
        await wait_for(lambda: len(client.messages) >= 7)  # start + 2 text chunks × 3
        assert not engine.closed
        client.gone.set()
    assert sorted(engine.closed) == sorted(r.request_id for r in engine.requests)
    assert len(engine.closed) == 3


async def test_disconnect_during_non_streamed_choices_closes_them_all(
    app: FastAPI, engine: FakeEngineClient
) -> None:
    engine.hang_after = 1
    client = Client({"messages": [{"role": "user", "content": "x"}], "n": 2})
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(
            app, client.scope("/v1/chat/completions"), client.receive, client.send
        )
        await wait_for(lambda: len(engine.requests) == 2)
        await anyio.sleep(0.05)
        client.gone.set()
    assert sorted(engine.closed) == sorted(r.request_id for r in engine.requests)
