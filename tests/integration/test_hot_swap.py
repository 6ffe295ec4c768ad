"""Hot swap under load, on a real server: 16 concurrent streams while the model behind an id
is replaced (SmolLM2 → Gemma), while a swap to a corrupt file is refused, and memory back
at the one-model baseline once the swapped-out model is retired.

The tests run in order on one server (module scope): each starts from the state the one
before left. Outcomes are checked per request: status 200, a finish reason, the usage
chunk, `[DONE]`, all `max_tokens` tokens when it stopped for length, and one model's
fingerprint in every chunk of a stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.model_registry_setup import (
    StreamOutcome,
    admin_models,
    entry,
    link_into,
    sha256_file,
    streams_during,
    tree_rss_bytes,
    write_config,
    write_manifest,
    write_truncated,
)
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

CLIENTS = 16
MAX_TOKENS = 12
RETIRE_TIMEOUT_S = 120.0


@dataclass
class Setup:
    folder: Path
    smollm2: str  # the real files
    gemma: str
    server: ServerProcess
    fingerprints: dict[str, str]  # model file name → its system_fingerprint
    baseline_rss: int = 0


@pytest.fixture(scope="module")
def setup(tmp_path_factory, smollm2_model_path, gemma3_model_path) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("hot-swap")
    smol = link_into(folder, smollm2_model_path, "smollm2.gguf")
    link_into(folder, gemma3_model_path, "gemma.gguf")
    write_truncated(folder, smollm2_model_path, "corrupt.gguf", 40 << 20)
    manifest = folder / "manifest.yaml"
    write_manifest(manifest, [entry("chat", smol, smollm2_model_path, n_ctx=512)])
    config = write_config(
        folder / "config.yaml",
        manifest,
        scheduler={"max_num_seqs": CLIENTS, "prefix_cache": {"slots": 2}},
    )
    server = ServerProcess("--config", str(config), log_path=folder / "server.log")
    try:
        server.wait_ready(180)
        yield Setup(folder, smollm2_model_path, gemma3_model_path, server, {})
    except (RuntimeError, TimeoutError) as exc:
        pytest.fail(f"{exc}:\n{(folder / 'server.log').read_text(errors='replace')[-4000:]}")
    finally:
        server.close()


def swap_body(setup: Setup, name: str, source: str) -> dict[str, object]:
    return {"action": "swap", **entry("chat", setup.folder / name, source, n_ctx=512)}


async def swap_under_load(setup: Setup, body: dict[str, object]) -> tuple[httpx.Response, list]:
    async with httpx.AsyncClient(base_url=setup.server.url, timeout=600) as admin:
        swap = asyncio.create_task(admin.post("/v1/admin/models", json=body))
        outcomes = await streams_during(
            setup.server.url, "chat", swap, clients=CLIENTS, max_tokens=MAX_TOKENS
        )
        return await swap, outcomes


async def load_round(setup: Setup) -> list[StreamOutcome]:
    """One stream per client, all at once (touches every sequence's KV)."""
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    task = asyncio.ensure_future(done)
    return await streams_during(
        setup.server.url, "chat", task, clients=CLIENTS, max_tokens=MAX_TOKENS
    )


def wait_retired(setup: Setup) -> None:
    """Until no model is retiring and every retired worker process is gone."""
    deadline = time.monotonic() + RETIRE_TIMEOUT_S
    while time.monotonic() < deadline:
        entries = admin_models(setup.server.url)["chat"]
        if [e["state"] for e in entries] == ["loaded"]:
            return
        time.sleep(0.5)
    pytest.fail(f"the old model did not retire: {admin_models(setup.server.url)}")


def assert_all_ok(outcomes: list[StreamOutcome]) -> None:
    failed = [o for o in outcomes if not o.ok(MAX_TOKENS)]
    assert not failed, f"{len(failed)}/{len(outcomes)} failed or truncated: {failed[:3]}"
    assert all(len(o.fingerprints) == 1 for o in outcomes), "a stream mixed two models"


async def test_baseline_one_model(setup: Setup) -> None:
    outcomes = await load_round(setup)
    assert_all_ok(outcomes)
    (fingerprint,) = {f for o in outcomes for f in o.fingerprints}
    setup.fingerprints["smollm2.gguf"] = fingerprint
    setup.baseline_rss = tree_rss_bytes(setup.server.process.pid)
    assert setup.baseline_rss > 100 << 20  # the API process and one worker with the weights


async def test_sixteen_streams_during_a_swap_all_complete(setup: Setup) -> None:
    response, outcomes = await swap_under_load(setup, swap_body(setup, "gemma.gguf", setup.gemma))
    assert response.status_code == 200, response.text
    assert response.json()["retiring"] == "chat" and response.json()["load_s"] > 0
    assert_all_ok(outcomes)
    after = await load_round(setup)  # every request from now on gets the new model
    (new,) = {f for o in after for f in o.fingerprints}
    old = setup.fingerprints["smollm2.gguf"]
    assert new != old
    setup.fingerprints["gemma.gguf"] = new
    seen = {f for o in outcomes for f in o.fingerprints}
    assert seen == {old, new}, "the swap should fall inside the streams' time span"
    wait_retired(setup)


async def test_a_swap_to_a_corrupt_file_fails_cleanly_under_load(setup: Setup) -> None:
    body = swap_body(setup, "corrupt.gguf", setup.smollm2)  # the real model's SHA-256
    response, outcomes = await swap_under_load(setup, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "model_verification_failed" and error["param"] == "sha256"
    assert "corrupt.gguf" in error["message"] and "does not match its SHA-256" in error["message"]
    assert_all_ok(outcomes)
    gemma = setup.fingerprints["gemma.gguf"]
    assert {f for o in outcomes for f in o.fingerprints} == {gemma}  # the old model served on
    (model,) = admin_models(setup.server.url)["chat"]
    assert model["state"] == "loaded" and "does not match" in str(model["error"])


async def test_memory_returns_to_the_one_model_baseline_after_retiring(setup: Setup) -> None:
    response, outcomes = await swap_under_load(
        setup, swap_body(setup, "smollm2.gguf", setup.smollm2)
    )
    assert response.status_code == 200, response.text
    assert_all_ok(outcomes)
    wait_retired(setup)
    assert_all_ok(await load_round(setup))  # the same load the baseline saw
    rss = tree_rss_bytes(setup.server.process.pid)
    ratio = rss / setup.baseline_rss
    assert 0.9 <= ratio <= 1.1, f"RSS {rss >> 20} MiB vs baseline {setup.baseline_rss >> 20} MiB"
    (model,) = admin_models(setup.server.url)["chat"]
    assert model["sha256"] == sha256_file(setup.smollm2)
