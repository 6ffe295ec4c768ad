"""The connection limits of cli/guarded_http.py on a real uvicorn (a trivial ASGI app on a
free loopback port): a connection cap answered with an OpenAI-shaped 503, a head that
never completes closed after header_timeout_s, a body that never completes answered 408."""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from inferflux.cli.guarded_http import ConnectionLimits, effective_max_connections, guarded_h11
from tests.integration.server_process import free_port


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    port = free_port()
    limits = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=4)
    config = uvicorn.Config(app, port=port, http=guarded_h11(limits), log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(10)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_a_head_that_never_ends_is_closed(port: int) -> None:
    with connect(port) as sock:
        sock.send(b"GET / HTTP/1.1\r\nhost: x\r\n")
        started = time.monotonic()
        assert read_all(sock) == b""
        assert 0.4 < time.monotonic() - started < 3


def test_a_body_that_never_ends_gets_408(port: int) -> None:
    with connect(port) as sock:
        sock.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n12")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408")
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout" and "server.body_timeout_s" in error["message"]


def _read_response(sock: socket.socket) -> bytes:
    """One whole chunked response: it may arrive in several segments (headers, then the
    body), and a single recv would leave the rest for the next request's read."""
    answer = b""
    while not answer.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(4096)
        assert chunk, f"the connection closed mid-response: {answer!r}"
        answer += chunk
    return answer


def test_a_complete_request_is_served_and_kept_alive(port: int) -> None:
    with connect(port) as sock:
        for _ in range(2):
            sock.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(0.7)  # past header_timeout_s: an idle kept-alive connection is fine


def test_connections_past_the_cap_get_503(port: int) -> None:
    held = [connect(port) for _ in range(4)]
    try:
        with connect(port) as extra:
            answer = read_all(extra)
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"retry-after: 1" in answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "overloaded"
    finally:
        for sock in held:
            sock.close()


def test_the_cap_stays_below_the_open_file_limit() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert effective_max_connections(10**9) == max(1, soft - 128)
    assert effective_max_connections(3) == 3
