"""`ollama pull` against InferFlux: the real `ollama` Python client, a real server, and the
loopback fake hub (fake_hub.py) serving the real SmolLM2 GGUF of the test fixtures.

A pulled model is downloaded into registry.models_dir, verified against the hub's LFS
hash, registered and loaded (as an admin-API load), so `/api/tags` lists it and it
generates. Progress streams in Ollama's NDJSON format; `stream: false` answers once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest
import yaml

from inferflux.api.ollama.pull import NOT_FOUND
from tests.integration.fake_hub import FakeHub, hub_env, serve_hub
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

REPO = "acme/SmolLM2-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def pulled(tmp_path_factory, smollm2_model_path) -> Iterator[tuple[ollama.Client, Path, str]]:
    """The client of a server whose hub is the fake one; yields it, the models folder and
    the served file's sha256."""
    folder = tmp_path_factory.mktemp("ollama-pull")
    data = Path(smollm2_model_path).read_bytes()
    fake = FakeHub({REPO: {FILE: data, "README.md": b"# smol\n"}})
    models = folder / "models"
    config = folder / "config.yaml"
    registry = {
        "models_dir": str(models),
        "max_resident_models": 3,
        "pull_sources": {"smol-mirror": f"hf://{REPO}/{FILE}@main"},
    }
    config.write_text(yaml.safe_dump({"model": {"path": smollm2_model_path},
                                      "registry": registry}))  # fmt: skip
    log = folder / "server.log"
    with serve_hub(fake) as endpoint:
        server = ServerProcess("--config", str(config), env=hub_env(endpoint, folder), log_path=log)
        try:
            server.wait_ready(120)
            with ollama.Client(host=server.url, timeout=120) as client:
                yield client, models, hashlib.sha256(data).hexdigest()
        except (RuntimeError, TimeoutError) as exc:
            pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
        finally:
            server.close()


def test_a_streamed_pull_reports_progress_registers_and_generates(pulled) -> None:
    client, models, sha256 = pulled
    lines = list(client.pull("hf.co/acme/SmolLM2-GGUF", stream=True))
    statuses = [line.status for line in lines]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    progress = [line for line in lines if line.digest]
    assert progress and all(line.digest == f"sha256:{sha256}" for line in progress)
    assert progress[-1].status == f"pulling {sha256[:12]}"
    assert progress[-1].completed == progress[-1].total == (models / REPO / FILE).stat().st_size
    names = [model.model for model in client.list().models]
    assert "hf.co/acme/SmolLM2-GGUF:latest" in names
    reply = client.generate(
        model="hf.co/acme/SmolLM2-GGUF", prompt="Hi", options={"num_predict": 3, "temperature": 0}
    )
    assert reply.done and reply.eval_count >= 1
    # pulling again finds the file registered: success, nothing new in the folder
    assert client.pull("hf.co/acme/SmolLM2-GGUF:latest").status == "success"
    assert not list(models.rglob("*.part-*"))


def test_a_configured_name_pulls_without_streaming(pulled) -> None:
    client, _, _ = pulled
    assert client.pull("smol-mirror").status == "success"
    assert "smol-mirror:latest" in [model.model for model in client.list().models]


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_name_is_ollamas_404(pulled, stream: bool) -> None:
    client, _, _ = pulled
    with pytest.raises(ollama.ResponseError) as caught:
        result = client.pull("llama3.2", stream=stream)
        if stream:
            list(result)
    assert caught.value.status_code == 404
    assert caught.value.error == NOT_FOUND


def test_a_missing_hub_file_is_a_404_naming_it(pulled) -> None:
    client, _, _ = pulled
    with pytest.raises(ollama.ResponseError) as caught:
        client.pull("hf.co/acme/SmolLM2-GGUF:nope.gguf")
    assert caught.value.status_code == 404
    assert "nope.gguf" in caught.value.error
