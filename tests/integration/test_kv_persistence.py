"""The prefix cache across restarts, on the real engine and through `inferflux serve`.

Engine level: a worker's final snapshot (its slots' entries and host tier moved to the
disk tier, the manifest written last) is adopted by the next worker, whose next turn of
the conversation restores it. A crash in the middle of a later snapshot (a half-written
manifest and blob left behind, a torn blob) leaves the previous snapshot usable: the
torn entry is refused by its checksum and recomputed, the others restore.

Server level: turn 2 of a conversation after a graceful restart prefills only its new
tokens (usage.prompt_tokens_details.cached_tokens); after a SIGKILL (no final snapshot)
the previous snapshot still loads.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from inferflux.config.kv_settings import KvPersistenceSettings, NvmeOffloadSettings, PagedKvSettings
from inferflux.config.settings import ObservabilitySettings, SchedulerSettings
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaTokenizer
from inferflux.engine.core import EngineCore
from inferflux.engine.engine_build import WorkerConfig, build_engine_core
from inferflux.engine.kv_disk import MANIFEST
from inferflux.engine.messages import AddRequest, SamplingParams
from tests.integration.server_process import ServerProcess

pytestmark = pytest.mark.model

TEXT = "Summarise the plot of a long novel about a lighthouse keeper and the sea. " * 4


def _core(path: str, folder: Path) -> EngineCore:
    config = WorkerConfig(
        worker_id=0,
        generation=1,
        input_address="",
        output_address="",
        context=ContextConfig(path, 512, 3, 256, 2, 2, False),
        max_num_seqs=2,
        max_batch_tokens=256,
        observability=ObservabilitySettings(),
        scheduling=SchedulerSettings.model_validate({"prefix_cache": {"slots": 1}}),
        paged_kv=PagedKvSettings(cpu_pages=16),
        nvme_offload=NvmeOffloadSettings(path=str(folder)),
        kv_persistence=KvPersistenceSettings(enabled=True, snapshot_interval_s=0),
    )
    return build_engine_core(config)


def _run(core: EngineCore, rid: str, prompt: list[int]) -> int:
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    core.add_request(AddRequest(request_id=rid, prompt_token_ids=prompt, sampling=sampling))
    cached = -1
    while core.has_work():
        for delta in core.step():
            cached = delta.num_cached_tokens
    return cached


def test_snapshot_survives_restart_and_a_crash_mid_write(
    smollm2_model_path: str, tmp_path: Path
) -> None:
    tok = LlamaTokenizer(smollm2_model_path)
    a = tok.tokenize(TEXT, add_special=True, parse_special=False)
    b = tok.tokenize("A different story. " + TEXT[::-1], add_special=True, parse_special=False)
    tok.close()
    core = _core(smollm2_model_path, tmp_path)
    _run(core, "a1", a)
    _run(core, "b1", b)  # a1's entry goes to the host tier; b1's stays in the slot
    core.close()  # final snapshot: both on disk, manifest written
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    blobs = sorted((folder / "blobs").glob("*.kv"))
    assert len(blobs) == 2 and (folder / MANIFEST).exists()

    # a crash in the middle of the next snapshot: partial files, one torn blob
    (folder / f"{MANIFEST}.tmp").write_bytes(b"\x85partial")
    (folder / "blobs" / "deadbeef.tmp-1").write_bytes(b"IFKV half")
    core = _core(smollm2_model_path, tmp_path)
    try:
        assert core.kv_offload is not None
        assert core.kv_offload.stats.disk_entries == 2  # both adopted, headers checked
        assert not (folder / f"{MANIFEST}.tmp").exists()  # leftovers swept
        assert not (folder / "blobs" / "deadbeef.tmp-1").exists()
        assert _run(core, "a2", a + [a[3], a[4]]) >= len(a)  # turn 2 restores from disk
        assert core.kv_offload.stats.disk_hits == 1
        b_entry = next(e for e in core.kv_offload.store.entries() if e.token_ids[: len(b)] == b)
        path = folder / "blobs" / f"{b_entry.key}.kv"
        path.write_bytes(path.read_bytes()[:-100])  # torn
        assert _run(core, "b2", b + [b[3], b[4]]) == 0  # refused, recomputed
        assert core.kv_offload.stats.refusals == 1
    finally:
        core.close()


def _chat(url: str, messages: list[dict[str, str]]) -> dict:
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.server
def test_turn_two_after_a_restart_prefills_only_its_new_tokens(
    smollm2_model_path: str, tmp_path: Path
) -> None:
    env = {
        "INFERFLUX_NVME_OFFLOAD_PATH": str(tmp_path / "kv"),
        "INFERFLUX_KV_CPU_PAGES": "64",
        "INFERFLUX_RUNTIME__KV_PERSISTENCE__ENABLED": "true",
    }
    args = ("--model", smollm2_model_path)
    turn1 = [{"role": "user", "content": TEXT}]
    server = ServerProcess(*args, env=env, log_path=tmp_path / "serve-1.log")
    try:
        server.wait_ready()
        first = _chat(server.url, turn1)
    finally:
        server.close()  # graceful: the worker writes its snapshot
    reply = first["choices"][0]["message"]["content"]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Shorter."},
    ]
    server = ServerProcess(*args, env=env, log_path=tmp_path / "serve-2.log")
    try:
        server.wait_ready()
        second = _chat(server.url, turn2)
        usage = second["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
        stats = httpx.get(f"{server.url}/server/stats", timeout=10).json()
        assert stats["kv_tiers"]["disk_hits"] == 1
        assert stats["kv_tiers"]["refusals"] == 0
    finally:
        server.kill()  # a crash: no final snapshot this time
    server = ServerProcess(*args, env=env, log_path=tmp_path / "serve-3.log")
    try:
        server.wait_ready()
        again = _chat(server.url, turn2)  # the first snapshot is still there
        assert (
            again["usage"]["prompt_tokens_details"]["cached_tokens"]
            >= (first["usage"]["prompt_tokens"])
        )
    finally:
        server.close()
