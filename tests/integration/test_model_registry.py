"""The model registry on a real server: two real models from a manifest routed by id and alias,
their GGUF facts in every listing, the manifest watched for added and removed entries, and a
manifest that does not verify refusing to start."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from inferflux.cli.inferctl import app as inferctl_app
from tests.integration.model_registry_setup import (
    admin_models,
    entry,
    link_into,
    write_config,
    write_manifest,
)
from tests.integration.server_process import INFERFLUX, ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

WAIT_S = 180.0


@dataclass
class Registry:
    folder: Path
    manifest: Path
    entries: list[dict[str, object]]
    server: ServerProcess


@pytest.fixture(scope="module")
def registry(tmp_path_factory, smollm2_model_path, gemma3_model_path) -> Iterator[Registry]:
    folder = tmp_path_factory.mktemp("registry")
    smol = link_into(folder / "models", smollm2_model_path, "smollm2.gguf")
    gemma = link_into(folder / "models", gemma3_model_path, "gemma.gguf")
    entries = [
        entry("smollm2", smol, smollm2_model_path, aliases=["smol"], default=True, n_ctx=512),
        entry("gemma", gemma, gemma3_model_path, n_ctx=512, workers=1, threads=1),
    ]
    for item in entries:
        item["path"] = f"models/{item['path']}"
    manifest = folder / "manifest.yaml"
    write_manifest(manifest, entries)
    config = write_config(
        folder / "config.yaml",
        manifest,
        registry={"path": str(manifest), "poll_interval_ms": 200, "max_resident_models": 3},
        scheduler={"max_num_seqs": 4, "prefix_cache": {"slots": 1}},
    )
    server = ServerProcess("--config", str(config), log_path=folder / "server.log")
    try:
        server.wait_ready(WAIT_S)
        wait_for(server.url, lambda models: models["gemma"][0]["state"] == "loaded")
        yield Registry(folder, manifest, entries, server)
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"{exc}:\n{(folder / 'server.log').read_text(errors='replace')[-4000:]}")
    finally:
        server.close()


def wait_for(url: str, condition, timeout_s: float = WAIT_S) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        models = admin_models(url)
        if condition(models):
            return models
        time.sleep(0.3)
    pytest.fail(f"timed out; models: {admin_models(url)}")


def chat(url: str, model: str | None) -> httpx.Response:
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    if model is not None:
        body["model"] = model
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_requests_route_by_id_and_alias(registry: Registry) -> None:
    url = registry.server.url
    answers = {name: chat(url, name) for name in ("smollm2", "smol", None, "gemma")}
    assert all(r.status_code == 200 for r in answers.values()), answers
    assert {answers[n].json()["model"] for n in ("smollm2", "smol", None)} == {"smollm2"}
    assert answers["gemma"].json()["model"] == "gemma"
    fingerprints = {n: r.json()["system_fingerprint"] for n, r in answers.items()}
    assert fingerprints["smollm2"] == fingerprints["smol"] != fingerprints["gemma"]
    response = chat(url, "llama3")
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_listings_carry_the_gguf_facts(registry: Registry) -> None:
    url = registry.server.url
    cards = {c["id"]: c["meta"] for c in httpx.get(f"{url}/v1/models").json()["data"]}
    assert list(cards) == ["smollm2", "gemma"]  # the default first
    smol, gemma = cards["smollm2"], cards["gemma"]
    assert (smol["architecture"], smol["quantization"], smol["parameter_size"]) == (
        "llama",
        "Q4_1",
        "134.52M",
    )
    assert smol["has_chat_template"] and smol["context_length"] == 8192 and smol["n_ctx"] == 512
    assert (gemma["architecture"], gemma["quantization"]) == ("gemma3", "Q4_K_M")
    assert not gemma["has_chat_template"] and gemma["context_length"] == 32768
    assert not smol["is_moe"] and gemma["n_experts"] == 0 and smol["aliases"] == ["smol"]
    tags = httpx.get(f"{url}/api/tags").json()["models"]
    assert [t["name"] for t in tags] == ["smollm2:latest", "gemma:latest"]
    assert tags[1]["details"]["quantization_level"] == "Q4_K_M"
    assert tags[1]["digest"] == registry.entries[1]["sha256"]  # the verified content hash
    shown = httpx.post(f"{url}/api/show", json={"model": "gemma:latest"}).json()
    assert shown["model_info"]["general.architecture"] == "gemma3"
    assert "<start_of_turn>" in shown["template"]  # Gemma's fallback chat template
    running = httpx.get(f"{url}/api/ps").json()["models"]
    assert {m["name"] for m in running} == {"smollm2:latest", "gemma:latest"}


def test_the_manifest_is_watched(registry: Registry) -> None:
    url = registry.server.url
    added = {**registry.entries[0], "id": "smol-copy", "aliases": [], "default": False}
    write_manifest(registry.manifest, [*registry.entries, added])
    models = wait_for(url, lambda m: "smol-copy" in m and m["smol-copy"][0]["state"] == "loaded")
    assert models["smol-copy"][0]["source"] == "manifest"
    assert chat(url, "smol-copy").json()["model"] == "smol-copy"
    write_manifest(registry.manifest, registry.entries)  # removed again
    wait_for(url, lambda m: "smol-copy" not in m)
    assert chat(url, "smol-copy").status_code == 404
    # a broken manifest changes nothing; the last good state keeps serving
    registry.manifest.write_text("models: [", encoding="utf-8")
    time.sleep(1.0)
    assert set(admin_models(url)) == {"smollm2", "gemma"}
    assert chat(url, "gemma").status_code == 200
    write_manifest(registry.manifest, registry.entries)


def _serve_exits(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INFERFLUX, "serve", "--port", "18599", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"sha256": "0" * 64}, "does not match its SHA-256"),
        ({"path": "../../etc/passwd"}, "resolves outside the models folder"),
        ({"signature": "AAAA"}, "registry.public_keys is empty"),
    ],
)
def test_a_manifest_that_does_not_verify_refuses_to_start(
    registry: Registry, tmp_path: Path, change, expected
) -> None:
    manifest = registry.folder / f"bad-{len(change)}-{next(iter(change))}.yaml"
    write_manifest(manifest, [{**registry.entries[0], **change}])
    config = write_config(tmp_path / "config.yaml", manifest)
    result = _serve_exits(config)
    assert result.returncode == 1, result.stderr[-2000:]
    assert expected in result.stderr


def test_inferctl_admin_models(registry: Registry) -> None:
    runner = CliRunner()
    url = registry.server.url
    listed = runner.invoke(inferctl_app, ["admin", "models", "--url", url])
    assert listed.exit_code == 0, listed.output
    assert "smollm2 (default): loaded" in listed.output and "gemma: loaded" in listed.output
    path = str(registry.folder / "models" / "smollm2.gguf")  # the same file here and there
    args = ["admin", "models", "--url", url, "--load", path, "--id", "smol-cli", "--alias", "sc"]
    loaded = runner.invoke(inferctl_app, args)
    assert loaded.exit_code == 0, loaded.output
    assert "load smol-cli: done in" in loaded.output and "smol-cli: loaded" in loaded.output
    assert chat(url, "sc").json()["model"] == "smol-cli"
    unloaded = runner.invoke(inferctl_app, ["admin", "models", "--url", url, "--unload", "sc"])
    assert unloaded.exit_code == 0 and "unload smol-cli: done" in unloaded.output
    refused = runner.invoke(inferctl_app, ["admin", "models", "--url", url, "--unload", "smollm2"])
    assert refused.exit_code == 1 and "409" in refused.output and "default" in refused.output
    usage = runner.invoke(inferctl_app, ["admin", "models", "--url", url, "--load", "/nope.gguf"])
    assert usage.exit_code == 2 and "--id" in usage.output
