"""Model replication end to end: two `inferflux serve` replicas (one worker each, each
with its own models folder, as pods on different hosts) share one real redis-server. A
model loaded through the admin API on A is listed and generates on B within seconds;
unloaded on A, it is unloaded on B; a model whose file only A has fails on B, which
says so in /server/stats and keeps serving."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.model_registry_setup import admin_models, link_into, sha256_file
from tests.integration.security_support import RedisServer
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

PROPAGATION_S = 30.0  # a load on B: verify the file, start a worker


@dataclass
class Replicas:
    a: ServerProcess
    b: ServerProcess
    sha256: str


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, smollm2_model_path: str
) -> Iterator[Replicas]:
    folder = tmp_path_factory.mktemp("model-replication")
    redis_server = RedisServer()
    servers: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            models = folder / f"models-{name}"
            link_into(models, smollm2_model_path, "second.gguf")
            if name == "a":
                link_into(models, smollm2_model_path, "only-a.gguf")
            env = {
                "INFERFLUX_REDIS_URL": redis_server.url,
                "INFERFLUX_REDIS__TIMEOUT_S": "1.0",
                "INFERFLUX_REDIS__POLICY_SYNC_INTERVAL_S": "1.0",
                "INFERFLUX_REGISTRY__MODELS_DIR": str(models),
            }
            log = folder / f"server-{name}.log"
            servers.append(ServerProcess("--workers", "1", env=env, log_path=log))
        for server, name in zip(servers, "ab", strict=True):
            try:
                server.wait_ready(240)
            except (RuntimeError, TimeoutError) as exc:
                text = (folder / f"server-{name}.log").read_text(errors="replace")
                pytest.fail(f"{exc}:\n{text[-4000:]}")
        yield Replicas(servers[0], servers[1], sha256_file(smollm2_model_path))
    finally:
        for server in servers:
            server.close()
        redis_server.kill()


def _within(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(0.2)


def _state(url: str, model_id: str) -> str | None:
    entries = admin_models(url).get(model_id)
    return None if not entries else str(entries[-1]["state"])


def _admin(url: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{url}/v1/admin/models", json=body, timeout=120)


def _stats(url: str) -> dict:
    return httpx.get(f"{url}/server/stats", timeout=30).json()["model_replication"]


def test_a_model_loaded_on_one_replica_serves_on_the_other(replicas: Replicas) -> None:
    a, b = replicas.a.url, replicas.b.url
    body = {"action": "load", "id": "second", "path": "second.gguf", "sha256": replicas.sha256}
    loaded = _admin(a, {**body, "n_ctx": 512, "workers": 1})
    assert loaded.status_code == 200, loaded.text
    _within(lambda: _state(b, "second") == "loaded", PROPAGATION_S)
    listed = httpx.get(f"{b}/v1/models", timeout=30).json()["data"]
    assert "second" in {model["id"] for model in listed}
    reply = httpx.post(
        f"{b}/v1/chat/completions",
        json={"model": "second", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "second"
    assert _stats(b)["version"] == _stats(a)["version"] >= 1

    unloaded = _admin(a, {"action": "unload", "id": "second"})
    assert unloaded.status_code == 200, unloaded.text
    _within(lambda: _state(b, "second") not in ("loaded", "retiring"), PROPAGATION_S)


def test_a_model_only_one_replica_has_fails_on_the_other_which_keeps_serving(
    replicas: Replicas,
) -> None:
    a, b = replicas.a.url, replicas.b.url
    body = {"action": "load", "id": "only-a", "path": "only-a.gguf", "sha256": replicas.sha256}
    loaded = _admin(a, {**body, "n_ctx": 512, "workers": 1})
    assert loaded.status_code == 200, loaded.text
    version = _stats(a)["version"]
    _within(lambda: _stats(b)["version"] == version, PROPAGATION_S)
    failed = _stats(b)["failed"]
    assert "only-a" in failed, failed
    assert _state(b, "only-a") != "loaded"
    reply = httpx.post(
        f"{b}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    time.sleep(2.5)  # two periodic checks: the version is not refused, nothing reloads
    assert _stats(b)["version"] == version
    assert _stats(b)["rejected"] == 0
    metrics = httpx.get(f"{b}/metrics", timeout=30).text
    assert f"inferflux_model_replication_version {float(version)}" in metrics
    assert "inferflux_model_replication_failed 1.0" in metrics
