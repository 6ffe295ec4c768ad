"""Hang detection over a real `inferflux serve --workers 2`: a worker made to hang with
SIGSTOP (alive, not answering) is taken out of rotation within a few seconds, the requests
queued on it that had not started are resubmitted to the other worker and complete, a
stream it had started ends with a clean `worker_died` error event, and it is killed and
replaced by a worker that joins once it answers a health check."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

DETECTION_BOUND_S = 8.0  # the default deadline (4 s) + ticks, with slack for a busy machine


@pytest.fixture(scope="module")
def log_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("log") / "server.log"


@pytest.fixture(scope="module")
def server(log_path: Path) -> Iterator[ServerProcess]:
    env = {"INFERFLUX_MODEL__CTX_SIZE": "512"}
    proc = ServerProcess("--workers", "2", env=env, log_path=log_path)
    try:
        proc.wait_ready()
        wait_until(lambda: all_ready(proc), 120, "both workers")
        yield proc
    finally:
        proc.close()


def workers(server: ServerProcess) -> list[dict]:
    return httpx.get(f"{server.url}/server/stats", timeout=5).json()["workers"]


def all_ready(server: ServerProcess) -> bool:
    current = workers(server)
    return len(current) == 2 and all(w["ready"] for w in current)


def wait_until(predicate, timeout_s: float, what: str) -> float:
    """Seconds it took `predicate` to hold; fails after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP `pid` (a real hang); SIGKILL it on the way out if the server has not."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def replaced(server: ServerProcess, worker_id: int, old_pid: int) -> bool:
    worker = next(w for w in workers(server) if w["worker_id"] == worker_id)
    return worker["ready"] and worker["pid"] != old_pid


def out_of_rotation(server: ServerProcess, worker_id: int, old_pid: int) -> bool:
    worker = next(w for w in workers(server) if w["worker_id"] == worker_id)
    return worker["pid"] != old_pid or not worker["ready"]


def complete(url: str, i: int) -> httpx.Response:
    body = {"prompt": f"Count to {i}:", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_requests_queued_on_a_hung_worker_are_resubmitted_and_complete(server, log_path):
    victim = workers(server)[0]
    with stopped(victim["pid"]):
        with ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(lambda i: complete(server.url, i), range(6)))
        assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
        assert all(r.json()["choices"][0]["finish_reason"] == "length" for r in replies)
        wait_until(lambda: out_of_rotation(server, victim["worker_id"], victim["pid"]), 10, "hang")
    log = log_path.read_text(errors="replace")
    held = [
        int(n) for n in re.findall(r"hung: no answer to a health ping .* held (\d+) requests", log)
    ]
    assert held and held[0] >= 1, "no request was queued on the hung worker"
    assert "resubmitting" in log
    wait_until(lambda: replaced(server, victim["worker_id"], victim["pid"]), 120, "replacement")
    worker = next(w for w in workers(server) if w["worker_id"] == victim["worker_id"])
    assert worker["hangs"] == 1 and worker["restarts"] == 1
    metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
    assert re.search(r'inferflux_worker_hangs_total\{worker="\d+"\} 1\.0', metrics)


def test_a_hung_worker_is_detected_within_the_deadline(server):
    wait_until(lambda: all_ready(server), 120, "both workers")
    victim = workers(server)[1]
    with stopped(victim["pid"]):
        took_s = wait_until(
            lambda: out_of_rotation(server, victim["worker_id"], victim["pid"]),
            DETECTION_BOUND_S,
            "the hang to be detected",
        )
    assert took_s < DETECTION_BOUND_S
    wait_until(lambda: replaced(server, victim["worker_id"], victim["pid"]), 120, "replacement")


def test_a_stream_started_on_a_hung_worker_ends_with_a_worker_died_event(server):
    wait_until(lambda: all_ready(server), 120, "both workers")
    body = {
        "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
        "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    seen: list[dict | str] = []
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = (ln[6:] for ln in response.iter_lines() if ln.startswith("data: "))
        seen += [json.loads(next(lines)) for _ in range(3)]
        holder = next(w for w in workers(server) if w["num_in_flight"] == 1)
        with stopped(holder["pid"]):
            seen += [line if line == "[DONE]" else json.loads(line) for line in lines]
    errors = [e for e in seen if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "worker_died"
    assert seen[-1] == "[DONE]"
    finishes = [c.get("finish_reason") for e in seen if isinstance(e, dict)
                for c in e.get("choices", [])]  # fmt: skip
    assert "length" not in finishes
    wait_until(lambda: replaced(server, holder["worker_id"], holder["pid"]), 120, "replacement")
    assert complete(server.url, 3).status_code == 200
