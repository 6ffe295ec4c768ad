"""Disaggregated prefill/decode on a real server (`scheduler.mode: disaggregated`, one
prefill and one decode worker, SmolLM2): the answers are the unified server's, the KV
crosses through shared-memory tickets that never outlive their requests, and killing
either worker with SIGKILL under load loses no request: each one completes or ends with
a clean error event, and the replacement joins its pool.
"""

from __future__ import annotations

import concurrent.futures
import glob
import json
import os
import signal
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.server_process import ServerProcess
from tests.integration.test_resilience import stats, wait_until

pytestmark = [pytest.mark.model, pytest.mark.server]

DISAGGREGATED = {
    "INFERFLUX_SCHEDULER__MODE": "disaggregated",
    "INFERFLUX_SCHEDULER__PREFILL_POOL_SIZE": "1",
    "INFERFLUX_SCHEDULER__DECODE_POOL_SIZE": "1",
    # the failover tests move four 1,300-token prefills onto the decode worker at once: on
    # a slow 2-core VM the last waited 43 s in its queue, past the 30 s default (a 408)
    "INFERFLUX_SCHEDULER__QUEUE_TIMEOUT_S": "300",
}
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea."]
# about 1,300 tokens: a prefill of a second or more on these cores
ESSAY = "The history of the printing press begins in the fifteenth century. " * 100


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    proc = ServerProcess(env=DISAGGREGATED, log_path=tmp_path_factory.mktemp("log") / "s.log")
    try:
        proc.wait_ready()
        # /readyz answers once the decode worker is: wait for the prefill worker too
        wait_until(lambda: all(w["ready"] for w in stats(proc)["workers"]), 120, "workers")
        yield proc
    finally:
        proc.close()


def worker(server: ServerProcess, role: str) -> dict:
    """The first worker of `role`'s pool (ids: the prefill pool first)."""
    workers = stats(server)["workers"]
    if all("role" in w for w in workers):
        return next(w for w in workers if w["role"] == role)
    return workers[0] if role == "prefill" else workers[1]


def ticket_files(server: ServerProcess) -> list[str]:
    """The live tickets' files (the ring's recycled files, `free*`, are not tickets)."""
    folders = glob.glob(f"/dev/shm/inferflux-kv-{server.process.pid}-*")
    assert len(folders) == 1, folders
    return [name for name in os.listdir(folders[0]) if not name.startswith("free")]


def chat(url: str, content: str, **extra: object) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 32,
            "temperature": 0, **extra}  # fmt: skip
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def idle(server: ServerProcess) -> bool:
    workers = stats(server)["workers"]
    return all(w["num_running"] == 0 and w["num_in_flight"] == 0 for w in workers)


def test_answers_are_the_unified_servers(server, server_url) -> None:
    for question in QUESTIONS:
        split = chat(server.url, question)
        unified = chat(server_url, question)
        assert split.status_code == unified.status_code == 200
        assert split.json()["choices"][0]["message"] == unified.json()["choices"][0]["message"]
        assert split.json()["usage"]["prompt_tokens"] == unified.json()["usage"]["prompt_tokens"]
    prefill = worker(server, "prefill")
    assert prefill["num_prompt_tokens_total"] > 0  # the prompts were computed there
    assert ticket_files(server) == []
    (folder,) = glob.glob(f"/dev/shm/inferflux-kv-{server.process.pid}-*")
    assert 1 <= len(os.listdir(folder)) <= 8  # the ring keeps recycled files, capacity at most


def test_the_ticket_folder_goes_with_the_server(tmp_path) -> None:
    proc = ServerProcess(env=DISAGGREGATED, log_path=tmp_path / "s.log")
    try:
        proc.wait_ready()
        wait_until(lambda: all(w["ready"] for w in stats(proc)["workers"]), 120, "workers")
        assert chat(proc.url, QUESTIONS[0]).status_code == 200
        assert glob.glob(f"/dev/shm/inferflux-kv-{proc.process.pid}-*")
    finally:
        proc.close()
    assert glob.glob(f"/dev/shm/inferflux-kv-{proc.process.pid}-*") == []


def test_a_stream_is_handed_off_and_its_ticket_deleted(server) -> None:
    body = {"messages": [{"role": "user", "content": ESSAY}], "max_tokens": 16,
            "temperature": 0, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    wait_until(lambda: idle(server), 10, "both workers to be idle")
    assert ticket_files(server) == []


def test_a_client_that_leaves_during_prefill_frees_everything(server) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "Summarize: " + ESSAY}],
                       "max_tokens": 200, "stream": True}).encode()  # fmt: skip
    # a raw socket: the response's headers come only with the first token, after prefill
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: worker(server, "prefill")["num_running"] == 1, 20, "prefill")
    wait_until(lambda: idle(server), 20, "the abort to reach the prefill worker")
    assert worker(server, "decode")["num_prompt_tokens_total"] < 1000  # never handed off
    assert ticket_files(server) == []


def test_a_client_that_leaves_during_decode_frees_everything(server) -> None:
    body = {"messages": [{"role": "user", "content": ESSAY}], "max_tokens": 2000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert sum(1 for line in _take(lines, 6) if line.startswith("data: ")) >= 2
        assert worker(server, "decode")["num_running"] == 1
    wait_until(lambda: idle(server), 20, "the abort to reach the decode worker")
    assert worker(server, "decode")["kv_cells_used"] == 0
    assert ticket_files(server) == []


def _take(lines: Iterator[str], n: int) -> list[str]:
    taken: list[str] = []
    for line in lines:
        if line:
            taken.append(line)
        if len(taken) == n:
            break
    return taken


def _load(url: str, n: int) -> list[concurrent.futures.Future[httpx.Response]]:
    pool = concurrent.futures.ThreadPoolExecutor(n)
    futures = [
        pool.submit(chat, url, f"{i}. {ESSAY} What century is it about?", max_tokens=48)
        for i in range(n)
    ]
    pool.shutdown(wait=False)
    return futures


def test_a_prefill_worker_killed_under_load_loses_no_request(server) -> None:
    old = worker(server, "prefill")
    futures = _load(server.url, 4)
    wait_until(lambda: worker(server, "prefill")["num_running"] >= 1, 30, "prefill load")
    os.kill(old["pid"], signal.SIGKILL)
    replies = [f.result(timeout=300) for f in futures]
    # every request completes: the lost prefills run on the decode worker instead
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    assert all(r.json()["choices"][0]["message"]["content"] for r in replies)
    wait_until(lambda: worker(server, "prefill")["ready"], 120, "the replacement")
    assert worker(server, "prefill")["restarts"] == old["restarts"] + 1
    before = worker(server, "prefill")["num_prompt_tokens_total"]
    assert chat(server.url, QUESTIONS[0]).status_code == 200
    # the replacement computed that prompt: its own counters replaced the dead worker's
    assert 0 < worker(server, "prefill")["num_prompt_tokens_total"] != before
    wait_until(lambda: idle(server), 10, "idle")
    assert ticket_files(server) == []


def test_a_decode_worker_killed_under_load_ends_streams_cleanly(server) -> None:
    old = worker(server, "decode")
    body = {"messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 1500, "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    seen: list[str] = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        seen += _take(lines, 3)
        queued = _load(server.url, 2)  # waiting in the prefill pool or the channel
        os.kill(old["pid"], signal.SIGKILL)
        seen += [line for line in lines if line]  # the stream must end on its own
    events = [json.loads(s[6:]) for s in seen if s.startswith("data: {")]
    errors = [e for e in events if "error" in e]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "worker_died"
    assert seen[-1] == "data: [DONE]"
    replies = [f.result(timeout=300) for f in queued]
    # not started when the worker died: resubmitted to the replacement, or a clean 5xx
    for reply in replies:
        assert reply.status_code in (200, 502, 503), reply.text
        if reply.status_code != 200:
            assert reply.json()["error"]["code"]
    wait_until(lambda: worker(server, "decode")["ready"], 120, "the replacement")
    assert worker(server, "decode")["restarts"] == old["restarts"] + 1
    assert chat(server.url, QUESTIONS[1]).status_code == 200
    wait_until(lambda: idle(server), 10, "idle")
    assert ticket_files(server) == []


def test_each_pool_scales_on_its_own(server) -> None:
    scaled = httpx.post(
        f"{server.url}/v1/admin/workers", json={"workers": 2, "role": "prefill"}, timeout=120
    )
    assert scaled.status_code == 200, scaled.text
    try:
        roles = [w["role"] for w in stats(server)["workers"] if not w.get("draining")]
        assert sorted(roles) == ["decode", "prefill", "prefill"]
        assert all(w["ready"] for w in stats(server)["workers"])
        for question in QUESTIONS:  # both prefill workers take prompts (least loaded first)
            assert chat(server.url, question).status_code == 200
    finally:
        back = httpx.post(
            f"{server.url}/v1/admin/workers", json={"workers": 1, "role": "prefill"}, timeout=120
        )
        assert back.status_code == 200, back.text
    wait_until(lambda: len(stats(server)["workers"]) == 2, 60, "the removed worker to stop")
    bad = httpx.post(f"{server.url}/v1/admin/workers", json={"workers": 2, "role": "x"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="pinning two pools apart needs 2 CPUs")
def test_each_pool_runs_on_the_cpus_it_is_pinned_to(tmp_path) -> None:
    env = DISAGGREGATED | {
        "INFERFLUX_SCHEDULER__DISAGGREGATED__PREFILL_CPUS": "0",
        "INFERFLUX_SCHEDULER__DISAGGREGATED__DECODE_CPUS": "1",
    }
    proc = ServerProcess(env=env, log_path=tmp_path / "s.log")
    try:
        proc.wait_ready()
        wait_until(lambda: all(w["ready"] for w in stats(proc)["workers"]), 120, "workers")
        pinned = {w["role"]: os.sched_getaffinity(w["pid"]) for w in stats(proc)["workers"]}
        assert pinned == {"prefill": {0}, "decode": {1}}
        assert chat(proc.url, QUESTIONS[1]).status_code == 200
    finally:
        proc.close()
