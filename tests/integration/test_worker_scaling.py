"""Runtime scaling over a real `inferflux serve --workers 2` with auth on: 16 streams in
flight while the workers go 2 → 3 → 1 through POST /v1/admin/workers, every stream
completing; bad input and a caller without the admin scope refused with OpenAI-shaped
errors; `inferctl admin workers` listing and scaling."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.inferctl_admin_server import ADMIN_KEY, GENERATE_KEY, cli, ok, server

pytestmark = [pytest.mark.model, pytest.mark.server]
__all__ = ["server"]  # the module-scoped fixture (auth on: an admin and a generate key)

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
GENERATE = {"authorization": f"Bearer {GENERATE_KEY}"}


def scale(server: str, body: object) -> httpx.Response:
    return httpx.post(f"{server}/v1/admin/workers", json=body, headers=ADMIN, timeout=300)


def stats(server: str) -> dict:
    return httpx.get(f"{server}/server/stats", headers=ADMIN, timeout=5).json()


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def settled(server: str, count: int) -> bool:
    workers = stats(server)["workers"]
    return len(workers) == count and all(w["ready"] and not w["draining"] for w in workers)


def stream(server: str, i: int) -> list[str]:
    """One streamed completion; the finish reasons it reported."""
    body = {"prompt": f"Story {i}: once upon a time", "max_tokens": 40, "temperature": 0,
            "stream": True}  # fmt: skip
    finishes: list[str] = []
    with httpx.stream(
        "POST", f"{server}/v1/completions", json=body, headers=GENERATE, timeout=300
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                assert "error" not in event, event
                finishes += [c["finish_reason"] for c in event["choices"] if c["finish_reason"]]
    return finishes


@pytest.fixture
def two_workers(server: str) -> Iterator[str]:
    assert scale(server, {"workers": 2}).status_code == 200
    wait_until(lambda: settled(server, 2), 180, "two workers")
    yield server


def test_16_streams_complete_while_scaling_2_3_1(two_workers: str) -> None:
    server = two_workers
    with ThreadPoolExecutor(16) as pool:
        streams = [pool.submit(stream, server, i) for i in range(16)]
        wait_until(lambda: stats(server)["num_in_flight"] >= 8, 60, "streams in flight")
        up = scale(server, {"workers": 3})
        assert up.status_code == 200, up.text
        assert up.json()["num_workers"] == 3
        assert stats(server)["num_workers"] == 3
        down = scale(server, {"workers": 1})
        assert down.status_code == 200, down.text
        assert down.json()["num_workers"] == 1 and down.json()["num_draining"] == 2
        finishes = [future.result() for future in streams]
    assert all(f in (["stop"], ["length"]) for f in finishes), finishes
    wait_until(lambda: settled(server, 1), 60, "the drained workers to stop")
    assert stats(server)["num_workers"] == 1
    assert [w["hangs"] for w in stats(server)["workers"]] == [0]  # slow steps are no hangs


def test_get_lists_the_default_models_workers(two_workers: str) -> None:
    answer = httpx.get(f"{two_workers}/v1/admin/workers", headers=ADMIN, timeout=5).json()
    (model,) = answer["data"]
    assert model["default"] is True and model["num_workers"] == 2
    assert {"worker_id", "pid", "ready", "hangs", "draining"} <= set(model["workers"][0])
    by_id = httpx.get(
        f"{two_workers}/v1/admin/workers", params={"model": model["model"]}, headers=ADMIN
    ).json()
    assert by_id["data"][0]["model"] == model["model"]


@pytest.mark.parametrize(
    "body, param",
    [({"workers": 0}, "workers"), ({"workers": 65}, "workers"), ({"workers": "x"}, "workers"),
     ({}, "workers"), ({"workers": 2, "extra": 1}, "extra")],
)  # fmt: skip
def test_bad_counts_are_400s_naming_the_field(server: str, body, param: str) -> None:
    reply = scale(server, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == param


def test_an_unknown_model_is_a_404(server: str) -> None:
    reply = scale(server, {"model": "no-such-model", "workers": 2})
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "model_not_found"
    listing = httpx.get(
        f"{server}/v1/admin/workers", params={"model": "no-such-model"}, headers=ADMIN
    )
    assert listing.status_code == 404


def test_without_the_admin_scope_it_is_a_403(server: str) -> None:
    reply = httpx.post(f"{server}/v1/admin/workers", json={"workers": 2}, headers=GENERATE)
    assert reply.status_code == 403
    assert reply.json()["error"]["code"] == "insufficient_scope"
    assert httpx.post(f"{server}/v1/admin/workers", json={"workers": 2}).status_code == 401


def test_inferctl_admin_workers_lists_and_scales(server: str) -> None:
    shown = ok(server, "workers").stdout
    assert "(default):" in shown and "worker " in shown
    scaled = json.loads(ok(server, "workers", "--set", "2", "--json").stdout)
    assert scaled["num_workers"] == 2
    wait_until(lambda: settled(server, 2), 180, "two workers")
    assert "workers 1, draining 1" in ok(server, "workers", "--set", "1").stdout
    assert cli(server, "workers", "--set", "0").exit_code == 2
    assert cli(server, "workers", "--model", "nope", "--set", "1").exit_code == 1
    refused = cli(server, "workers", "--set", "1", key=GENERATE_KEY)
    assert refused.exit_code == 1
