"""SSE framing and EventStreamResponse: the event generator is closed whatever happens."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import anyio
import pytest
from starlette.types import Message

from inferflux.api.sse import SSE_DONE, EventStreamResponse, sse_data, sse_error
from inferflux.errors import EngineDeadError

SCOPE = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/"}


def test_sse_data_framing() -> None:
    assert sse_data({"a": "é", "b": None}) == 'data: {"a":"é","b":null}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_sse_error_is_the_envelope() -> None:
    event = sse_error(EngineDeadError("gone"))
    assert event == (
        b'data: {"error":{"message":"gone","type":"server_error","param":null,'
        b'"code":"worker_died"}}\n\n'
    )


class Recorder:
    """An ASGI `send` that records messages and can disconnect after the first body."""

    def __init__(self, *, fail_with: Exception | None = None) -> None:
        self.messages: list[Message] = []
        self.disconnected = anyio.Event()
        self.fail_with = fail_with

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and message["body"]:
            if self.fail_with is not None:
                raise self.fail_with
            self.disconnected.set()
        self.messages.append(message)

    async def receive(self) -> Message:
        await self.disconnected.wait()
        return {"type": "http.disconnect"}

    async def receive_nothing(self) -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def make_events(closed: list[str], *, hang: bool) -> AsyncGenerator[bytes, None]:
    async def events() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: 1\n\n"
            if hang:
                await anyio.sleep_forever()
            yield b"data: 2\n\n"
        finally:
            closed.append("closed")

    return events()


async def test_complete_stream() -> None:
    closed: list[str] = []
    recorder = Recorder()
    recorder.disconnected = anyio.Event()  # never disconnects
    response = EventStreamResponse(make_events(closed, hang=False))
    with anyio.fail_after(5):
        await response(SCOPE, recorder.receive_nothing, recorder.send)
    start, *bodies = recorder.messages
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"cache-control"] == b"no-cache"
    assert b"content-length" not in headers
    assert [m["body"] for m in bodies] == [b"data: 1\n\n", b"data: 2\n\n", b""]
    assert bodies[-1]["more_body"] is False
    assert closed == ["closed"]


async def test_disconnect_cancels_and_closes_the_generator() -> None:
    closed: list[str] = []
    recorder = Recorder()
    response = EventStreamResponse(make_events(closed, hang=True))
    with anyio.fail_after(5):
        await response(SCOPE, recorder.receive, recorder.send)
    assert closed == ["closed"]


@pytest.mark.parametrize("error", [OSError("broken pipe"), ConnectionResetError()])
async def test_send_failure_closes_the_generator(error: Exception) -> None:
    closed: list[str] = []
    recorder = Recorder(fail_with=error)
    response = EventStreamResponse(make_events(closed, hang=False))
    with anyio.fail_after(5):
        await response(SCOPE, recorder.receive_nothing, recorder.send)
    assert closed == ["closed"]
