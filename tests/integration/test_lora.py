"""LoRA adapters at runtime on a real server, with real LoRA GGUFs generated for SmolLM2 by the
`gguf` package: load, select (`base:adapter` and the `adapter` field), the adapter measurably
changes the output while the base model's stays identical, refusals, swap under load, unload.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from inferflux.cli.inferctl import app as inferctl_app
from tests.integration.model_registry_setup import (
    entry,
    link_into,
    sha256_file,
    streams_during,
    write_config,
    write_lora,
    write_manifest,
)
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

URL = "/v1/admin/adapters"
PROMPT = "The capital of France is"


@dataclass
class Lora:
    folder: Path
    server: ServerProcess

    def adapter(self, name: str, action: str = "load", **extra: object) -> dict[str, object]:
        path = self.folder / name
        return {"action": action, "id": "pirate", "base": "chat", "path": name,
                "sha256": sha256_file(str(path)), **extra}  # fmt: skip


@pytest.fixture(scope="module")
def lora(tmp_path_factory, smollm2_model_path, gemma3_model_path) -> Iterator[Lora]:
    folder = tmp_path_factory.mktemp("lora")
    smol = link_into(folder, smollm2_model_path, "smollm2.gguf")
    write_lora(folder / "pirate.gguf", smollm2_model_path, seed=0)
    write_lora(folder / "pirate2.gguf", smollm2_model_path, seed=1)
    write_lora(folder / "gemma-lora.gguf", gemma3_model_path, seed=0)
    manifest = folder / "manifest.yaml"
    write_manifest(manifest, [entry("chat", smol, smollm2_model_path, n_ctx=512)])
    config = write_config(
        folder / "config.yaml",
        manifest,
        registry={"path": str(manifest), "max_resident_models": 3},
        scheduler={"max_num_seqs": 8, "prefix_cache": {"slots": 1}},
    )
    server = ServerProcess("--config", str(config), log_path=folder / "server.log")
    try:
        server.wait_ready(180)
        yield Lora(folder, server)
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"{exc}:\n{(folder / 'server.log').read_text(errors='replace')[-4000:]}")
    finally:
        server.close()


def complete(url: str, **fields: object) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1, **fields}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def first_logprob(answer: dict) -> tuple[str, float]:
    logprobs = answer["choices"][0]["logprobs"]
    return logprobs["tokens"][0], logprobs["token_logprobs"][0]


def test_an_adapter_changes_the_output_and_leaves_the_base_alone(lora: Lora) -> None:
    url = lora.server.url
    base_before = complete(url, model="chat")
    response = httpx.post(f"{url}{URL}", json=lora.adapter("pirate.gguf"), timeout=300)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "chat:pirate" and response.json()["load_s"] > 0
    by_name = complete(url, model="chat:pirate")
    by_field = complete(url, model="chat", adapter="pirate")
    assert by_name["model"] == by_field["model"] == "chat:pirate"
    assert by_name["choices"][0]["text"] == by_field["choices"][0]["text"]  # one model
    base_after = complete(url, model="chat")
    assert base_after["choices"][0]["text"] == base_before["choices"][0]["text"]
    assert first_logprob(base_after) == pytest.approx(first_logprob(base_before))
    # the adapter's first token, or at least its probability, is measurably different
    (base_token, base_lp), (lora_token, lora_lp) = first_logprob(base_after), first_logprob(by_name)
    assert base_token != lora_token or abs(base_lp - lora_lp) > 0.5
    assert by_name["choices"][0]["text"] != base_after["choices"][0]["text"]
    ollama = httpx.post(
        f"{url}/api/generate",
        json={
            "model": "chat:pirate",
            "prompt": PROMPT,
            "raw": True,
            "stream": False,
            "options": {"temperature": 0, "num_predict": 8},
        },  # fmt: skip
        timeout=120,
    )
    assert ollama.status_code == 200, ollama.text  # Ollama names it `base:adapter` too
    assert ollama.json()["model"] == "chat:pirate" and ollama.json()["response"]
    listed = httpx.get(f"{url}{URL}").json()["data"]
    assert [(a["id"], a["base"], a["model"], a["state"]) for a in listed] == [
        ("pirate", "chat", "chat:pirate", "loaded")
    ]
    ids = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
    assert ids == ["chat", "chat:pirate"]


@pytest.mark.parametrize(
    ("change", "status", "expected"),
    [
        ({"sha256": "0" * 64, "id": "bad"}, 422, "does not match its SHA-256"),
        ({"path": "gemma-lora.gguf", "id": "g"}, 422, "is for gemma3, not for the base"),
        ({"path": "smollm2.gguf", "id": "s"}, 422, "is not a LoRA adapter GGUF"),
        ({"base": "nope", "id": "n"}, 404, "model 'nope' not found"),
        ({}, 409, "use action swap"),
        ({"path": "../x.gguf", "id": "x"}, 422, "outside the models folder"),
    ],
)
def test_bad_adapters_are_refused(lora: Lora, change, status, expected) -> None:
    body = {**lora.adapter("pirate.gguf"), **change}
    if "path" in change and change["path"] != "../x.gguf":
        body["sha256"] = sha256_file(str(lora.folder / str(change["path"])))
    response = httpx.post(f"{lora.server.url}{URL}", json=body, timeout=300)
    assert response.status_code == status, response.text
    assert expected in response.json()["error"]["message"]


async def test_an_adapter_swap_under_load_drops_nothing(lora: Lora) -> None:
    url = lora.server.url
    old = complete(url, model="chat:pirate")["system_fingerprint"]
    async with httpx.AsyncClient(base_url=url, timeout=600) as admin:
        swap = asyncio.create_task(
            admin.post(URL, json=lora.adapter("pirate2.gguf", action="swap"))
        )
        outcomes = await streams_during(url, "chat:pirate", swap, clients=8, max_tokens=8)
        response = await swap
    assert response.status_code == 200, response.text
    assert response.json()["retiring"] == "chat:pirate"
    failed = [o for o in outcomes if not o.ok(8)]
    assert not failed, failed[:3]
    new = complete(url, model="chat:pirate")["system_fingerprint"]
    assert new != old
    assert {f for o in outcomes for f in o.fingerprints} <= {old, new}


def test_unloading_an_adapter(lora: Lora) -> None:
    url = lora.server.url
    body = {"action": "unload", "id": "pirate", "base": "chat"}
    response = httpx.post(f"{url}{URL}", json=body, timeout=120)
    assert response.status_code == 200, response.text
    gone = httpx.post(
        f"{url}/v1/completions", json={"model": "chat:pirate", "prompt": "x"}, timeout=60
    )
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert complete(url, model="chat")["model"] == "chat"


def test_inferctl_admin_adapters(lora: Lora) -> None:
    runner = CliRunner()
    url = lora.server.url
    path = str(lora.folder / "pirate.gguf")  # the same file here and on the server
    args = ["admin", "adapters", "--url", url, "--base", "chat", "--load", path]
    loaded = runner.invoke(inferctl_app, [*args, "--id", "cli", "--scale", "0.5"])
    assert loaded.exit_code == 0, loaded.output
    assert "load chat:cli: done in" in loaded.output
    assert "chat:cli: loaded  scale 0.5" in loaded.output
    assert complete(url, model="chat:cli")["model"] == "chat:cli"
    listed = runner.invoke(inferctl_app, ["admin", "adapters", "--url", url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert "chat:cli" in {a["model"] for a in json.loads(listed.output)["data"]}
    again = runner.invoke(inferctl_app, [*args, "--id", "cli"])
    assert again.exit_code == 1 and "409" in again.output
    unload = ["admin", "adapters", "--url", url, "--base", "chat", "--unload", "cli"]
    unloaded = runner.invoke(inferctl_app, unload)
    assert unloaded.exit_code == 0 and "unload chat:cli: done" in unloaded.output
    no_base = runner.invoke(inferctl_app, ["admin", "adapters", "--url", url, "--unload", "cli"])
    assert no_base.exit_code == 2 and "--base" in no_base.output
