"""The real server survives its worker dying and cancels work for clients that leave."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

LONG_STREAM = {
    "messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}],
    "max_tokens": 1500,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--model-id", "smol", log_path=tmp_path_factory.mktemp("log") / "server.log"
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.close()


def stats(server: ServerProcess) -> dict:
    return httpx.get(f"{server.url}/server/stats", timeout=5).json()


def sse_events(lines: Iterator[str]) -> Iterator[dict | str]:
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield data if data == "[DONE]" else json.loads(data)


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_client_disconnect_cancels_generation(server) -> None:
    before = stats(server)["workers"][0]
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=LONG_STREAM) as response,
    ):
        assert response.status_code == 200
        events = sse_events(response.iter_lines())
        contents = [next(events) for _ in range(4)]
        assert all(isinstance(e, dict) and e["choices"] for e in contents)
        wait_until(lambda: stats(server)["workers"][0]["num_running"] == 1, 10, "running")
    # leaving the block closed the connection mid-stream
    wait_until(lambda: stats(server)["workers"][0]["num_running"] == 0, 10, "the abort")
    after = stats(server)["workers"][0]
    generated = after["num_generated_tokens_total"] - before["num_generated_tokens_total"]
    assert 0 < generated < 300  # far short of max_tokens: the sequence left the batch
    assert after["kv_cells_used"] == 0
    assert after["num_in_flight"] == 0


def test_worker_killed_mid_stream_ends_the_stream_with_an_error_and_restarts(server) -> None:
    worker = stats(server)["workers"][0]
    old_pid = worker["pid"]
    assert worker["ready"] and old_pid != server.process.pid
    events_seen: list[dict | str] = []
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=LONG_STREAM) as response,
    ):
        events = sse_events(response.iter_lines())
        events_seen += [next(events) for _ in range(3)]
        os.kill(old_pid, signal.SIGKILL)
        events_seen += list(events)  # the stream must end on its own, not hang
    errors = [e for e in events_seen if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1
    assert errors[0]["error"]["code"] == "worker_died"
    assert events_seen[-1] == "[DONE]"
    finishes = [
        c.get("finish_reason")
        for e in events_seen
        if isinstance(e, dict)
        for c in e.get("choices", [])
    ]
    assert "length" not in finishes

    ready = httpx.get(f"{server.url}/readyz", timeout=5)
    assert ready.status_code == 503
    assert ready.json()["error"]["type"]
    busy = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=10
    )
    assert busy.status_code == 503
    assert busy.headers.get("retry-after")

    wait_until(
        lambda: httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200, 60, "restart"
    )
    worker = stats(server)["workers"][0]
    assert worker["restarts"] == 1 and worker["pid"] != old_pid
    reply = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=30
    )
    assert reply.status_code == 200
    assert reply.json()["usage"]["completion_tokens"] >= 1


def _gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie awaiting its reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return any(line.startswith("State:\tZ") for line in status)
    except FileNotFoundError:
        return True


def test_a_worker_exits_when_its_api_process_is_killed_mid_stream(tmp_path) -> None:
    proc = ServerProcess(
        log_path=tmp_path / "server.log", env={"INFERFLUX_MODEL__CTX_SIZE": "2048"}
    )
    try:
        proc.wait_ready()
        worker_pid = stats(proc)["workers"][0]["pid"]
        with (
            httpx.Client(base_url=proc.url, timeout=30) as client,
            client.stream("POST", "/v1/chat/completions", json=LONG_STREAM) as response,
        ):
            events = sse_events(response.iter_lines())
            assert [next(events) for _ in range(3)]
            os.kill(proc.process.pid, signal.SIGKILL)
        wait_until(lambda: _gone(worker_pid), 30, "the orphaned worker to exit")
    finally:
        proc.close()
