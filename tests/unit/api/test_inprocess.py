"""`api/inprocess.dispatch` over a real (small) Starlette app: status, headers and body
chunks as they are sent, and a caller that leaves early is a disconnect the app sees."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from inferflux.api.inprocess import InProcessRequest, dispatch

ENDED = asyncio.Event()


async def echo(request: Request) -> Response:
    body = await request.json()
    headers = {"x-seen": request.headers.get("authorization", "")}
    ext = request.scope["extensions"].get("marker")
    return JSONResponse({"body": body, "marker": ext}, status_code=201, headers=headers)


async def endless(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        try:
            n = 0
            while True:
                n += 1
                yield f"chunk {n}\n".encode()
                await asyncio.sleep(0.01)
        finally:
            ENDED.set()

    return StreamingResponse(chunks())


APP = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/endless", endless)])


async def test_a_request_goes_through_and_its_answer_comes_back():
    request = InProcessRequest(
        "POST",
        "/echo",
        [(b"authorization", b"Bearer k")],
        b'{"a": 1}',
        extensions={"marker": "m"},
    )
    async with dispatch(APP, request) as exchange:
        assert exchange.status == 201
        assert (b"x-seen", b"Bearer k") in exchange.headers
        assert await exchange.read() == b'{"body":{"a":1},"marker":"m"}'


async def test_leaving_early_disconnects_the_app():
    ENDED.clear()
    async with dispatch(APP, InProcessRequest("GET", "/endless", [])) as exchange:
        seen = []
        async for chunk in exchange.chunks():
            seen.append(chunk)
            if len(seen) == 3:
                break
    assert seen[0] == b"chunk 1\n"
    await asyncio.wait_for(ENDED.wait(), 5)  # the stream's generator was closed
