"""Models named by URL, served by real servers: `hf://` (the loopback fake hub,
fake_hub.py) and `http://` with a SHA-256, in the manifest, added to it while serving,
and as `--model`; downloaded once into the models folder, verified, quantized when asked,
loaded and generating. The served file is a real GGUF (synthetic_gguf.py: F16, random
weights); `quantization: Q8_0` makes the server quantize it after the download.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from inferflux.engine.gguf_metadata import read_gguf_metadata
from tests.integration.fake_hub import FakeHub, hub_env, serve_hub
from tests.integration.model_registry_setup import admin_models, link_into, write_manifest
from tests.integration.server_process import INFERFLUX, ServerProcess
from tests.integration.synthetic_gguf import write_tiny_llama

pytestmark = [pytest.mark.model, pytest.mark.server]

REPO = "acme/tiny-GGUF"
HF_URL = f"hf://{REPO}/tiny.f16.gguf@main"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, smollm2_model_path) -> Iterator[tuple[FakeHub, str, bytes]]:
    folder = tmp_path_factory.mktemp("url-source")
    data = write_tiny_llama(folder / "tiny.f16.gguf", smollm2_model_path).read_bytes()
    fake = FakeHub({REPO: {"tiny.f16.gguf": data}})
    with serve_hub(fake) as endpoint:
        yield fake, endpoint, data


def _generates(url: str, model: str) -> None:
    body = {"model": model, "prompt": "Hello", "max_tokens": 3, "temperature": 0}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1


def _wait_loaded(url: str, model_id: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [m["state"] for m in admin_models(url).get(model_id, [])]
        if "loaded" in states:
            return
        time.sleep(0.3)
    pytest.fail(f"{model_id} not loaded after {timeout_s}s: {admin_models(url).get(model_id)}")


def _wait_failed(url: str, model_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        [*views] = admin_models(url).get(model_id, [])
        if views and views[0]["state"] == "failed":
            assert "download failed" in str(views[0]["error"])
            return
        time.sleep(0.3)
    pytest.fail(f"{model_id} not failed after {timeout_s}s: {admin_models(url).get(model_id)}")


def _start(log: Path, env: dict[str, str], *args: str) -> ServerProcess:
    server = ServerProcess(*args, env=env, log_path=log)
    try:
        server.wait_ready(120)
    except (RuntimeError, TimeoutError) as exc:
        server.close()
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-4000:]}")
    return server


def test_manifest_urls_download_once_quantize_load_and_restart_without_network(
    hub, tmp_path: Path, smollm2_model_path: str
) -> None:
    fake, endpoint, data = hub
    env = hub_env(endpoint, tmp_path)
    models = tmp_path / "models"
    smol = link_into(models, smollm2_model_path, "smollm2.gguf")
    smol_sha = hashlib.sha256(smol.read_bytes()).hexdigest()
    entries = [
        {"id": "smol", "path": smol.name, "sha256": smol_sha, "default": True},
        {"id": "tiny", "path": HF_URL, "quantization": "Q8_0"},
    ]
    manifest = models / "models.yaml"
    write_manifest(manifest, entries)
    config = tmp_path / "config.yaml"
    registry = {"path": str(manifest), "poll_interval_ms": 200, "max_resident_models": 3}
    config.write_text(yaml.safe_dump({"registry": registry}))
    log = tmp_path / "server.log"
    server = _start(log, env, "--config", str(config))
    try:
        _wait_loaded(server.url, "tiny")
        _generates(server.url, "tiny")
        show = httpx.post(f"{server.url}/api/show", json={"model": "tiny"}, timeout=30).json()
        assert show["details"]["quantization_level"] == "Q8_0"
        # an http:// entry added while serving: fetched on a thread, then loaded
        url = f"{endpoint}/{REPO}/resolve/main/tiny.f16.gguf"
        sha = hashlib.sha256(data).hexdigest()
        write_manifest(manifest, [*entries, {"id": "tiny-http", "path": url, "sha256": sha}])
        _wait_loaded(server.url, "tiny-http")
        _generates(server.url, "tiny-http")
        # an admin-API load of the same URL and level: the files are already there
        load = {"action": "load", "id": "tiny-admin", "path": HF_URL, "quantization": "Q8_0"}
        reply = httpx.post(f"{server.url}/v1/admin/models", json=load, timeout=120)
        assert reply.status_code == 200, reply.text
        _generates(server.url, "tiny-admin")
        # an entry whose file the hub does not have: listed as failed, the rest serves on
        broken = {"id": "broken", "path": f"hf://{REPO}/nope.gguf@main"}
        write_manifest(manifest, [*entries, broken])
        _wait_failed(server.url, "broken")
        _generates(server.url, "tiny")
    finally:
        server.close()
    assert (models / REPO / "tiny.f16.gguf").read_bytes() == data
    [quantized] = models.glob("tiny.f16.Q8_0.*.gguf")
    assert read_gguf_metadata(quantized).quantization_name == "Q8_0"
    assert (models / f"tiny.f16.{sha[:12]}.gguf").is_file()
    assert not list(models.rglob("*.part-*"))
    assert f"downloading {HF_URL}" in log.read_text()
    assert len(fake.downloads) == 2  # the hf:// file and the http:// one, once each

    # `--model hf://…` with the same models folder: found there, no request to the hub
    config.write_text(yaml.safe_dump({"registry": {"models_dir": str(models)}}))
    again = _start(tmp_path / "again.log", env, "--config", str(config), "--model", HF_URL)
    try:
        _generates(again.url, "tiny.f16")
    finally:
        again.close()
    assert len(fake.downloads) == 2


def _serve_exit(tmp_path: Path, env: dict[str, str], model: dict[str, str]):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"model": model, "registry": {"models_dir": str(tmp_path)}}))
    return subprocess.run(
        [INFERFLUX, "serve", "--config", str(config)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_an_https_model_url_without_sha256_exits_2(hub, tmp_path: Path) -> None:
    _, endpoint, _ = hub
    done = _serve_exit(tmp_path, hub_env(endpoint, tmp_path), {"path": "https://x.test/m.gguf"})
    assert done.returncode == 2
    assert "is an http(s) URL: set its sha256" in done.stderr and "Traceback" not in done.stderr


def test_a_url_whose_download_does_not_match_exits_1_and_keeps_nothing(hub, tmp_path) -> None:
    _, endpoint, _ = hub
    model = {"path": f"{endpoint}/{REPO}/resolve/main/tiny.f16.gguf", "sha256": "0" * 64}
    done = _serve_exit(tmp_path, hub_env(endpoint, tmp_path), model)
    assert done.returncode == 1
    assert "sha256 mismatch" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.gguf*"))


def test_a_missing_hub_file_exits_1_naming_it(hub, tmp_path: Path) -> None:
    _, endpoint, _ = hub
    model = {"path": f"hf://{REPO}/nope.gguf@main"}
    done = _serve_exit(tmp_path, hub_env(endpoint, tmp_path), model)
    assert done.returncode == 1
    assert "cannot pull acme/tiny-GGUF/nope.gguf@main" in done.stderr
    assert "Traceback" not in done.stderr
