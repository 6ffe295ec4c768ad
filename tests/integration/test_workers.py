"""Several engine workers: requests spread over them, and one dying leaves the other serving."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("log") / "server.log"
    # two workers with small contexts keep the KV memory of the test low
    proc = ServerProcess("--workers", "2", env={"INFERFLUX_MODEL__CTX_SIZE": "512"}, log_path=log)
    try:
        proc.wait_ready()
        # /readyz answers once one worker is ready; wait for the second one too
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            workers = httpx.get(f"{proc.url}/server/stats", timeout=5).json()["workers"]
            if all(w["ready"] for w in workers):
                break
            time.sleep(0.2)
        yield proc
    finally:
        proc.close()


def complete(url: str, i: int) -> httpx.Response:
    body = {"prompt": f"Count to {i}:", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_requests_spread_over_both_workers(server) -> None:
    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda i: complete(server.url, i), range(6)))
    assert [r.status_code for r in replies] == [200] * 6
    workers = httpx.get(f"{server.url}/server/stats").json()["workers"]
    assert len(workers) == 2
    assert all(w["num_generated_tokens_total"] > 0 for w in workers)
    assert len({w["pid"] for w in workers}) == 2


def test_one_worker_dying_leaves_the_other_serving(server) -> None:
    # wait until both are ready (a previous test may have left one restarting)
    workers = httpx.get(f"{server.url}/server/stats").json()["workers"]
    assert all(w["ready"] for w in workers)
    os.kill(workers[0]["pid"], signal.SIGKILL)
    # readiness holds while one worker serves
    replies = [complete(server.url, i) for i in range(3)]
    assert [r.status_code for r in replies] == [200] * 3, [r.text for r in replies]
    assert httpx.get(f"{server.url}/readyz").status_code == 200
