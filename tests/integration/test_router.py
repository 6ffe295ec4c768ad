"""`inferflux router` over three real `inferflux serve` replicas on loopback (issue 19).

One module-scoped cluster: three replicas (SmolLM2, one worker, one thread each, an API
key so the router's passthrough of credentials is exercised) and a router in its own
process group. The kill -9 test comes last: it kills a replica mid-load and restarts it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from tests.integration.server_process import RouterProcess, ServerProcess

API_KEY = "router-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
REPLICA_HEADER = "x-inferflux-replica"
START_TIMEOUT_S = 240.0
REPLICA_ENV = {"INFERFLUX_RUNTIME__N_THREADS": "1"}
ROUTER_ENV = {
    "INFERFLUX_ROUTER__HEALTH_INTERVAL_S": "0.25",
    "INFERFLUX_ROUTER__EJECT_AFTER_FAILURES": "2",
    "INFERFLUX_ROUTER__HEALTH_TIMEOUT_S": "0.5",
    "INFERFLUX_ROUTER__AFFINITY_BLOCK_CHARS": "32",
    "INFERFLUX_LOG_LEVEL": "debug",  # even so, no credential reaches the router's log
}


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.config = tmp / "replica.yaml"
        keys = [{"id": "test", "key": API_KEY, "roles": ["admin"]}]
        self.config.write_text(yaml.safe_dump({"auth": {"api_keys": keys}}))
        self.replicas = [self._replica(i) for i in range(3)]
        for replica in self.replicas:
            replica.wait_ready(START_TIMEOUT_S)
        self.router = RouterProcess(
            *(r.url for r in self.replicas), env=ROUTER_ENV, log_path=tmp / "router.log"
        )
        self.router.wait_ready(60)
        self.url = self.router.url

    def _replica(self, index: int, port: int | None = None, tag: str = "") -> ServerProcess:
        return ServerProcess(
            "--workers", "1", "--config", str(self.config),
            env=REPLICA_ENV, log_path=self.tmp / f"replica{index}{tag}.log", port=port,
        )  # fmt: skip

    def restart(self, index: int) -> None:
        old = self.replicas[index]
        self.replicas[index] = self._replica(index, port=old.port, tag="-restarted")
        self.replicas[index].wait_ready(START_TIMEOUT_S)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/router/stats", timeout=5).json()

    def close(self) -> None:
        self.router.close()
        for replica in self.replicas:
            replica.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router")
    started = None
    try:
        started = Cluster(tmp)
        yield started
    finally:
        if started is not None:
            started.close()


@pytest.fixture(scope="module")
def model(cluster) -> str:
    answer = httpx.get(f"{cluster.url}/v1/models", headers=AUTH, timeout=10)
    assert answer.status_code == 200
    assert answer.headers[REPLICA_HEADER] in {"0", "1", "2"}
    return str(answer.json()["data"][0]["id"])


def _chat(model: str, text: str, **extra) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }


def test_chat_and_completions_through_the_router(cluster, model):
    chat = httpx.post(
        f"{cluster.url}/v1/chat/completions", json=_chat(model, "Say hi."), headers=AUTH,
        timeout=60,
    )  # fmt: skip
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"]
    assert chat.headers[REPLICA_HEADER] in {"0", "1", "2"}
    completion = httpx.post(
        f"{cluster.url}/v1/completions",
        json={"model": model, "prompt": "The capital of France is", "max_tokens": 4},
        headers=AUTH,
        timeout=60,
    )
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"]


def test_sse_stream_is_relayed_event_by_event(cluster, model):
    body = _chat(model, "Count to three.", stream=True, max_tokens=8)
    with httpx.stream(
        "POST", f"{cluster.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in {"stop", "length"}


def test_ollama_chat_ndjson_stream(cluster, model):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name a color."}],
        "options": {"num_predict": 6},
    }
    with httpx.stream(
        "POST", f"{cluster.url}/api/chat", json=body, headers=AUTH, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert lines[-1]["done"] is True
    assert all("message" in line for line in lines)


def test_credentials_pass_through_and_replicas_enforce_them(cluster, model):
    url = f"{cluster.url}/v1/chat/completions"
    missing = httpx.post(url, json=_chat(model, "hi"), timeout=30)
    wrong = httpx.post(url, json=_chat(model, "hi"), headers={"Authorization": "Bearer no"})
    for answer in (missing, wrong):
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] in {"invalid_api_key", "missing_api_key"}
        assert REPLICA_HEADER in answer.headers  # the replica said it, not the router


def test_bad_input_gets_the_replicas_errors_or_the_routers_413(cluster):
    url = f"{cluster.url}/v1/chat/completions"
    malformed = httpx.post(
        url, content=b'{"model": ', headers={**AUTH, "content-type": "application/json"}
    )
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "invalid_request_error"
    huge = httpx.post(url, content=b"x" * (9 * 1024 * 1024), headers=AUTH, timeout=30)
    assert huge.status_code == 413
    assert huge.json()["error"]["code"] == "request_too_large"
    assert REPLICA_HEADER not in huge.headers
    unknown = httpx.get(f"{cluster.url}/v1/no-such-route", headers=AUTH)
    assert unknown.status_code == 404
    assert "error" in unknown.json()


def test_responses_websocket_mode_through_the_router(cluster, model):
    from websockets.sync.client import connect

    url = cluster.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers=AUTH) as socket:
        ids = []
        for text in ("My name is Ada.", "What is my name?"):
            create = {"type": "response.create", "model": model, "input": text,
                      "max_output_tokens": 4}  # fmt: skip
            if ids:
                create["previous_response_id"] = ids[-1]  # the chain stays on one replica
            socket.send(json.dumps(create))
            while (event := json.loads(socket.recv(timeout=60)))["type"] not in (
                "response.completed",
                "response.incomplete",
                "error",
            ):
                pass
            assert event["type"] != "error", event
            ids.append(event["response"]["id"])


async def _conversation(client: httpx.AsyncClient, model: str, name: str, turns: int) -> list:
    system = f"You are assistant {name}. Keep every answer short and friendly. " * 2
    messages = [{"role": "system", "content": system}]
    replicas = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Conversation {name}, question {turn}."})
        body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
        answer = await client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        replicas.append(answer.headers[REPLICA_HEADER])
        reply = answer.json()["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": reply})
    return replicas


def test_conversations_keep_their_replica_and_spread(cluster, model):
    async def run() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=cluster.url, headers=AUTH, timeout=120) as client:
            names = [f"c{i}" for i in range(6)]
            return list(await asyncio.gather(*(_conversation(client, model, n, 3) for n in names)))

    per_conversation = asyncio.run(run())
    for replicas in per_conversation:
        assert len(set(replicas)) == 1, per_conversation  # every turn on one replica
    homes = Counter(replicas[0] for replicas in per_conversation)
    assert len(homes) >= 2, homes  # conversations spread over replicas
    assert max(homes.values()) <= 4, homes
    decisions = cluster.stats()["decisions"]
    assert decisions.get("affinity", 0) >= 12  # turns 2 and 3 of six conversations


def test_router_stats_metrics_and_probes(cluster):
    assert httpx.get(f"{cluster.url}/livez").status_code == 200
    ready = httpx.get(f"{cluster.url}/readyz")
    assert ready.status_code == 200 and ready.json()["replicas_healthy"] == 3
    stats = cluster.stats()
    assert [r["healthy"] for r in stats["replicas"]] == [True, True, True]
    assert stats["routing"] == "prefix_affinity"
    metrics = httpx.get(f"{cluster.url}/metrics").text
    assert "inferflux_router_requests_total" in metrics
    assert "inferflux_router_added_latency_seconds_bucket" in metrics
    assert API_KEY not in metrics and API_KEY not in json.dumps(stats)
    assert httpx.get(f"{cluster.url}/v1/models?api_key={API_KEY}").status_code in (200, 401)
    log = (cluster.tmp / "router.log").read_text(errors="replace")
    assert "/v1/models" in log and API_KEY not in log


def _running(replica_url: str) -> int:
    stats = httpx.get(f"{replica_url}/server/stats", headers=AUTH, timeout=10).json()
    return int(stats["num_running"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_frees_the_replica(cluster, model, stream):
    """Gone while waiting for a whole answer, or mid-stream: the router closes its
    connection to the replica, which aborts the generation."""
    body = _chat(model, f"A very long story, streamed={stream}.", max_tokens=2000,
                 ignore_eos=True, stream=stream)  # fmt: skip
    url = f"{cluster.url}/v1/chat/completions"
    with httpx.Client(headers=AUTH, timeout=60) as client:
        if stream:
            with client.stream("POST", url, json=body) as response:
                next(response.iter_lines())
                home = cluster.replicas[int(response.headers[REPLICA_HEADER])]
        else:
            with pytest.raises(httpx.ReadTimeout):
                client.post(url, json=body, timeout=httpx.Timeout(60, read=2.0))
            home = max(cluster.replicas, key=lambda r: _running(r.url))
    deadline = time.monotonic() + 15
    while _running(home.url):
        assert time.monotonic() < deadline, "the replica still generates for nobody"
        time.sleep(0.2)


async def _stream(client: httpx.AsyncClient, model: str, i: int, started: asyncio.Event) -> dict:
    body = _chat(model, f"Stream {i}: tell a long story about the sea.", stream=True,
                 max_tokens=300, ignore_eos=True)  # fmt: skip
    events: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        replica = response.headers[REPLICA_HEADER]
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                if len(events) == 2:
                    started.set()
    return {"replica": replica, "events": events}


def test_a_hung_replica_is_ejected_its_streams_end_and_it_rejoins(cluster, model):
    """SIGSTOP (a real hang: the sockets stay open, nothing answers) on one replica while
    it streams: the router ends its streams with the error event once the health checks
    time out, serves new requests elsewhere, and re-admits it after SIGCONT."""

    async def run() -> tuple[list[dict], str]:
        async with httpx.AsyncClient(base_url=cluster.url, headers=AUTH, timeout=120) as client:
            flags = [asyncio.Event() for _ in range(3)]
            tasks = [asyncio.create_task(_stream(client, model, i, flags[i])) for i in range(3)]
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 120)
            busy = {r["index"]: r["in_flight"] for r in cluster.stats()["replicas"]}
            victim = max(busy, key=lambda k: busy[k])
            os.killpg(cluster.replicas[victim].process.pid, signal.SIGSTOP)
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 60)), str(victim)

    try:
        results, victim = asyncio.run(run())
        hung = [r for r in results if r["replica"] == victim]
        assert hung
        for result in hung:
            assert json.loads(result["events"][-2])["error"]["code"] == "worker_died"
        assert cluster.stats()["replicas"][int(victim)]["healthy"] is False
        answer = httpx.post(
            f"{cluster.url}/v1/chat/completions", json=_chat(model, "While one is hung"),
            headers=AUTH, timeout=60,
        )  # fmt: skip
        assert answer.status_code == 200 and answer.headers[REPLICA_HEADER] != victim
    finally:
        for replica in cluster.replicas:
            os.killpg(replica.process.pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while not all(r["healthy"] for r in cluster.stats()["replicas"]):
        assert time.monotonic() < deadline, "resumed replica not re-admitted"
        time.sleep(0.25)


def test_a_replica_killed_mid_load_loses_only_its_streams(cluster, model):
    async def run() -> tuple[list[dict], str]:
        async with httpx.AsyncClient(base_url=cluster.url, headers=AUTH, timeout=120) as client:
            flags = [asyncio.Event() for _ in range(6)]
            tasks = [asyncio.create_task(_stream(client, model, i, flags[i])) for i in range(6)]
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 120)
            busy = {r["index"]: r["in_flight"] for r in cluster.stats()["replicas"]}
            victim = max(busy, key=lambda k: busy[k])
            cluster.replicas[victim].kill()
            return list(await asyncio.gather(*tasks)), str(victim)

    results, victim = asyncio.run(run())
    cut = [r for r in results if r["replica"] == victim]
    whole = [r for r in results if r["replica"] != victim]
    assert cut and whole
    for result in cut:  # a clean error event, then [DONE]
        assert result["events"][-1] == "[DONE]"
        assert json.loads(result["events"][-2])["error"]["code"] == "worker_died"
    for result in whole:
        assert result["events"][-1] == "[DONE]"
        last = json.loads(result["events"][-2])
        assert last["choices"][0]["finish_reason"] == "length"

    for i in range(6):  # new requests go to the others
        answer = httpx.post(
            f"{cluster.url}/v1/chat/completions", json=_chat(model, f"After the kill {i}"),
            headers=AUTH, timeout=60,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.headers[REPLICA_HEADER] != victim
    stats = cluster.stats()
    assert stats["replicas"][int(victim)]["healthy"] is False
    assert stats["replicas"][int(victim)]["ejections"] >= 1

    cluster.restart(int(victim))  # same port: re-admitted after a passing check
    deadline = time.monotonic() + 30
    while not cluster.stats()["replicas"][int(victim)]["healthy"]:
        assert time.monotonic() < deadline, "restarted replica not re-admitted"
        time.sleep(0.25)
    answer = httpx.get(f"{cluster.url}/readyz").json()
    assert answer["replicas_healthy"] == 3
