"""Vision models through a real `inferflux serve`: `--model vision` (SmolLM2 with the demo
mmproj), a manifest entry with an mmproj, and the refusal of an mmproj whose SHA-256 does
not match. What the listings say is checked with the clients that read them (the openai
SDK, the ollama client); generating with images is tested where the engine side is.

Each server gets its own HOME, so the demo mmproj is built there, not in the user's cache.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import ollama
import openai
import pytest
import yaml

from tests.integration.fake_hub import FakeHub, hub_env, serve_hub
from tests.integration.server_process import INFERFLUX, ServerProcess, free_port
from tests.mmproj_header import sha256_hex, write_projector_header

pytestmark = [pytest.mark.model, pytest.mark.server]


def _demo_vision():  # noqa: ANN202 (the module)
    from inferflux.models import demo_vision

    return demo_vision


def _assert_vision(url: str, model_id: str, *, vision: bool = True) -> None:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x") as client:
        (card,) = [m for m in client.models.list().data if m.id == model_id]
    assert card.model_extra is not None
    assert ("image" in card.model_extra["architecture"]["input_modalities"]) is vision
    with ollama.Client(host=url) as client:
        shown = client.show(model_id)
    assert ("vision" in (shown.capabilities or [])) is vision
    tags = {m["name"]: m for m in httpx.get(f"{url}/api/tags").json()["models"]}
    assert ("clip" in tags[f"{model_id}:latest"]["details"]["families"]) is vision


def test_model_vision_serves_smollm2_with_the_demo_mmproj(tmp_path) -> None:
    _demo_vision()
    server = ServerProcess("--model", "vision", env={"HOME": str(tmp_path)})
    try:
        server.wait_ready()
        assert [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]] == ["vision"]
        _assert_vision(server.url, "vision")
    finally:
        server.close()
    assert list((tmp_path / ".cache/inferflux/models").glob("inferflux-demo-vision-*.gguf"))


def _manifest(folder: Path, smollm2: str, mmproj: Path, mmproj_sha256: str) -> Path:
    os.link(smollm2, folder / "m.gguf")
    sha = sha256_hex(folder / "m.gguf")
    entries = [
        {"id": "see", "path": "m.gguf", "sha256": sha, "default": True,
         "mmproj": mmproj.name, "mmproj_sha256": mmproj_sha256},
        {"id": "text", "path": "m.gguf", "sha256": sha},
    ]  # fmt: skip
    path = folder / "models.yaml"
    path.write_text(yaml.safe_dump({"models": entries}), encoding="utf-8")
    return path


def test_a_manifest_entry_with_an_mmproj_is_a_vision_model(tmp_path, smollm2_model_path) -> None:
    demo = _demo_vision()
    mmproj = tmp_path / "demo.mmproj.gguf"
    demo.build_demo_mmproj(mmproj)
    manifest = _manifest(tmp_path, smollm2_model_path, mmproj, sha256_hex(mmproj))
    server = ServerProcess("--registry", str(manifest), env={"HOME": str(tmp_path)})
    try:
        server.wait_ready()
        _assert_vision(server.url, "see")
        _assert_vision(server.url, "text", vision=False)
    finally:
        server.close()


def test_an_hf_mmproj_is_downloaded_once_into_the_models_folder(
    tmp_path, smollm2_model_path
) -> None:
    demo = _demo_vision()
    mmproj = tmp_path / "source" / "mmproj.gguf"
    mmproj.parent.mkdir()
    demo.build_demo_mmproj(mmproj)
    fake = FakeHub({"acme/vision-GGUF": {"mmproj.gguf": mmproj.read_bytes()}})
    folder = tmp_path / "models"
    folder.mkdir()
    manifest = _manifest(folder, smollm2_model_path, mmproj, "unused")
    entries = yaml.safe_load(manifest.read_text(encoding="utf-8"))["models"]
    entries[0].update(mmproj="hf://acme/vision-GGUF/mmproj.gguf@main")
    del entries[0]["mmproj_sha256"]  # the hub's LFS hash is checked instead
    manifest.write_text(yaml.safe_dump({"models": entries}), encoding="utf-8")
    with serve_hub(fake) as endpoint:
        env = {**hub_env(endpoint, tmp_path), "HOME": str(tmp_path)}
        server = ServerProcess("--registry", str(manifest), env=env)
        try:
            server.wait_ready()
            _assert_vision(server.url, "see")
        finally:
            server.close()
    local = folder / "acme" / "vision-GGUF" / "mmproj.gguf"
    assert local.read_bytes() == mmproj.read_bytes()
    (download,) = fake.downloads  # once
    assert download.startswith("/acme/vision-GGUF/resolve/") and download.endswith("/mmproj.gguf")


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INFERFLUX, "serve", "--port", str(free_port()), *args],
        env={**os.environ, **(env or {})},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_mismatched_mmproj_hash_stops_the_server(tmp_path, smollm2_model_path) -> None:
    # A header-only stand-in (tests/mmproj_header.py): refused before anything reads it.
    mmproj = write_projector_header(tmp_path / "mmproj.gguf")
    manifest = _manifest(tmp_path, smollm2_model_path, mmproj, "00" * 32)
    done = _serve("--registry", str(manifest))
    assert done.returncode == 1, done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"inferflux: mmproj file {mmproj.resolve()}")
    assert "does not match its SHA-256" in last_line and "Traceback" not in done.stderr
    env = {"INFERFLUX_MODEL__MMPROJ_SHA256": "00" * 32}
    done = _serve("--mmproj", str(mmproj), env=env)
    assert done.returncode == 1 and "does not match its SHA-256" in done.stderr, done.stderr
