"""Clients misbehaving, each beside a 16-stream load that must not notice: thousands of
idle connections, slowloris heads and bodies, a very slow SSE reader, and abrupt
disconnects mid-body and mid-stream. The server runs with short limits so the suite is
quick: server.header_timeout_s and server.body_timeout_s 4 s (defaults 20 and 60)."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, StreamLoad, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving, wait_until
from tests.integration.server_process import ServerProcess

HEADER_TIMEOUT_S = 4.0
BODY_TIMEOUT_S = 4.0
SLACK_S = 3.0  # a loaded 2-core machine's timer lateness
ENV = {
    "INFERFLUX_SERVER__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
    "INFERFLUX_SERVER__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
}
CHAT = "/v1/chat/completions"


def _connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", port))
    return sock


def _reset(sock: socket.socket) -> None:
    """Close with RST (an abrupt disconnect), not FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


_RECEIVED: dict[int, bytes] = {}  # id(socket) → what the server sent on it


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed `sock` (a non-blocking read finds the end of the
    stream); what it sent is kept in _RECEIVED. No select(): it refuses descriptors past
    1023, and the idle-connections fault holds 2,000 sockets."""
    try:
        while chunk := sock.recv(65536, socket.MSG_DONTWAIT):
            _RECEIVED[id(sock)] = _RECEIVED.get(id(sock), b"") + chunk
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    return True


def _head(body_len: int, port: int) -> bytes:
    return (
        f"POST {CHAT} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {body_len}\r\n\r\n"
    ).encode()


def _chat_body(max_tokens: int) -> bytes:
    return json.dumps(
        {
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
    ).encode()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def _under_load(run: ChaosRun, url: str, result: FaultResult) -> Iterator[None]:
    load = StreamLoad(url, LoadSpec(streams=run.streams, max_tokens=16)).start()
    try:
        yield
    finally:
        counts = tally(load.stop())
        result.count(counts)
        result.notes.append(f"background load: {counts.ok} ok of {counts.sent}")
        result.check(counts.ok == counts.sent and counts.sent > 0, "background load unaffected")


def _all_closed(socks: list[socket.socket], timeout_s: float) -> float | None:
    open_ = list(socks)

    def check() -> bool:
        open_[:] = [s for s in open_ if not _closed_by_server(s)]
        return not open_

    return wait_until(check, timeout_s)


def idle_connections(run: ChaosRun, server: ServerProcess) -> FaultResult:
    port, url = server.port, server.url
    num = 500 if run.quick else 2000
    result = FaultResult(
        f"{num} idle connections (never send a byte)",
        target=f"background load unaffected; all closed ≤ header_timeout_s "
        f"({HEADER_TIMEOUT_S:g} s) + {SLACK_S:g} s",
        passed=True,
    )
    with _under_load(run, url, result):
        socks = [_connect(port) for _ in range(num)]
        opened_at = time.monotonic()
        closed_s = _all_closed(socks, HEADER_TIMEOUT_S + 30)
        result.recovery_s = None if closed_s is None else time.monotonic() - opened_at
        for sock in socks:
            sock.close()
    result.check(
        result.recovery_s is not None and result.recovery_s <= HEADER_TIMEOUT_S + SLACK_S,
        "idle connections closed in time",
    )
    return result


def _trickle(socks: list[socket.socket], until_s: float, byte: bytes) -> float | None:
    """Send one `byte` per socket every 0.5 s until the server closed them all; seconds."""
    started = time.monotonic()
    open_ = list(socks)
    while open_ and time.monotonic() - started < until_s:
        for sock in list(open_):
            if _closed_by_server(sock):
                open_.remove(sock)
                continue
            with contextlib.suppress(OSError):
                sock.send(byte)
        time.sleep(0.5)
    return None if open_ else time.monotonic() - started


def slowloris_heads(run: ChaosRun, server: ServerProcess) -> FaultResult:
    port, url = server.port, server.url
    result = FaultResult(
        "slowloris heads (100 connections, 1 header byte / 0.5 s)",
        target=f"background load unaffected; closed ≤ header_timeout_s + {SLACK_S:g} s",
        passed=True,
    )
    with _under_load(run, url, result):
        socks = [_connect(port) for _ in range(100)]
        for sock in socks:
            sock.send(f"POST {CHAT} HTTP/1.1\r\nhost: x\r\nx-slow: ".encode())
        result.recovery_s = _trickle(socks, HEADER_TIMEOUT_S + 30, b"a")
        for sock in socks:
            sock.close()
    result.check(
        result.recovery_s is not None and result.recovery_s <= HEADER_TIMEOUT_S + SLACK_S,
        "slow heads cut in time",
    )
    return result


def slowloris_bodies(run: ChaosRun, server: ServerProcess) -> FaultResult:
    port, url = server.port, server.url
    result = FaultResult(
        "slowloris bodies (50 connections, 1 body byte / 0.5 s)",
        target=f"background load unaffected; 408 (OpenAI-shaped) ≤ body_timeout_s + {SLACK_S:g} s",
        passed=True,
    )
    with _under_load(run, url, result):
        socks = [_connect(port) for _ in range(50)]
        for sock in socks:
            sock.send(_head(1000, port) + b'{"messages": ')
        result.recovery_s = _trickle(socks, BODY_TIMEOUT_S + 30, b" ")
        answers = [_RECEIVED.pop(id(sock), b"") for sock in socks]
        for sock in socks:
            sock.close()
    num_408 = sum(a.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in a for a in answers)
    result.notes.append(f"{num_408} of {len(socks)} got 408 request_timeout")
    result.check(num_408 == len(socks), "every slow body got 408")
    result.check(
        result.recovery_s is not None and result.recovery_s <= BODY_TIMEOUT_S + SLACK_S,
        "slow bodies cut in time",
    )
    return result


def _num_aborted(log_path: Path) -> int:
    """Generations the server logged as aborted (`generation <id> abort: ...`)."""
    return len(re.findall(r"generation chatcmpl-\w+ abort", log_path.read_text(errors="replace")))


def _aborted_within(log_path: Path, before: int, count: int, timeout_s: float) -> float | None:
    """Seconds until `count` more generations were aborted than `before`, or None."""
    return wait_until(lambda: _num_aborted(log_path) >= before + count, timeout_s)


def slow_reader(run: ChaosRun, server: ServerProcess) -> FaultResult:
    """One stream read at 2 KiB/s through a 4 KiB receive buffer, then reset."""
    port, url = server.port, server.url
    read_s = run.seconds(20)
    result = FaultResult(
        f"very slow SSE reader (2 KiB/s for {read_s:.0f} s, max_tokens 1500)",
        target="API RSS growth ≤ 50 MB; the request aborted ≤ 10 s after the reset",
        passed=True,
    )
    with _under_load(run, url, result):
        rss_before = _rss_mb(server.process.pid)
        aborted_before = _num_aborted(_log(server))
        sock = _connect(port, rcvbuf=4096)
        body = _chat_body(1500)
        sock.send(_head(len(body), port) + body)
        received = 0
        started = time.monotonic()
        while time.monotonic() - started < read_s:
            with contextlib.suppress(TimeoutError):
                received += len(sock.recv(1024))
            time.sleep(0.5)
        rss_grew = _rss_mb(server.process.pid) - rss_before
        _reset(sock)
        result.recovery_s = _aborted_within(_log(server), aborted_before, 1, 15)
    result.notes.append(
        f"read {received} bytes in {read_s:.0f} s; API process RSS grew {rss_grew:.1f} MB"
    )
    result.check(rss_grew <= 50, "RSS bounded")
    result.check(result.recovery_s is not None and result.recovery_s <= 10, "aborted after reset")
    return result


def disconnects(run: ChaosRun, server: ServerProcess) -> FaultResult:
    """50 requests reset mid-body, 16 streams reset after their first bytes."""
    port, url = server.port, server.url
    result = FaultResult(
        "abrupt disconnects: 50 mid-body, 16 mid-stream (RST)",
        target="background load unaffected; reset streams aborted ≤ 10 s; no 500 logged",
        passed=True,
    )
    with _under_load(run, url, result):
        aborted_before = _num_aborted(_log(server))
        for _ in range(50):
            sock = _connect(port)
            sock.send(_head(10_000, port) + b'{"messages": [')
            _reset(sock)
        streams = []
        body = _chat_body(1500)
        for _ in range(16):
            sock = _connect(port)
            sock.send(_head(len(body), port) + body)
            streams.append(sock)
        for sock in streams:
            sock.recv(512)  # the head and a first event: the stream has started
            _reset(sock)
        result.recovery_s = _aborted_within(_log(server), aborted_before, len(streams), 20)
    result.sent += 66
    result.check(result.recovery_s is not None and result.recovery_s <= 10, "aborted after reset")
    return result


def _log(server: ServerProcess) -> Path:
    return Path(server.log_path)


def client_faults(run: ChaosRun) -> list[FaultResult]:
    faults: list[Callable[[ChaosRun, ServerProcess], FaultResult]] = [
        idle_connections,
        slowloris_heads,
        slowloris_bodies,
        disconnects,
        slow_reader,
    ]
    results = []
    with serving(run.log_dir, "clients", env=ENV) as server:
        for fault in faults:
            started = time.monotonic()
            try:
                result = fault(run, server)
            except Exception as exc:  # noqa: BLE001 - one crashed fault is one failed row
                result = FaultResult(fault.__name__, target="runs", notes=[f"crashed: {exc!r}"])
            result.duration_s = time.monotonic() - started
            results.append(result)
    log = (run.log_dir / "clients.log").read_text(errors="replace")
    num_500 = log.count('" 500') + log.count("Exception in ASGI application")
    results[-1].notes.append(f"server log: {num_500} 500s / unhandled exceptions")
    for result in results:
        result.check(num_500 == 0, "no 500 or unhandled exception in the server log")
    return results
