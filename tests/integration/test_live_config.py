"""Live tuning against a real server: GET/PATCH /v1/admin/config change the scheduler,
backpressure and logging of running workers without a restart, refuse restart-only keys
with a 409 and bad values with a 400, and audit each change.

One `inferflux serve` for the module (its own settings: one sequence at a time, so a
second request queues; a step budget of 256; JSON logs to a file the tests read).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

ADMIN = "sk-live-admin-0123456789"
ACME = "sk-live-acme-0123456789"
GLOBEX = "sk-live-globex-0123456789"
PEPPER = "a-live-config-test-pepper"
LONG_PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 12


class Server:
    def __init__(self, process: ServerProcess, log_path: Path, audit_path: Path) -> None:
        self.url = process.url
        self.log_path = log_path
        self.audit_path = audit_path

    def client(self, key: str = ADMIN) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=120)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("live-config")
    audit_path = folder / "audit.jsonl"
    config = {
        "scheduler": {"max_num_seqs": 1, "max_batch_tokens": 256},
        "observability": {"log_format": "json"},
        "audit": {"path": str(audit_path)},
        "auth": {
            "pepper": PEPPER,
            "api_keys": [
                {"key": ADMIN, "id": "admin", "roles": ["admin"], "tenant": "ops"},
                {"key": ACME, "id": "acme", "roles": ["user"], "tenant": "acme"},
                {"key": GLOBEX, "id": "globex", "roles": ["user"], "tenant": "globex"},
            ],
        },
    }
    config_path = folder / "config.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    log_path = folder / "server.log"
    process = ServerProcess("--config", str(config_path), log_path=log_path)
    try:
        process.wait_ready(180)
        yield Server(process, log_path, audit_path)
    finally:
        process.close()


async def _patch(server: Server, change: dict[str, Any], key: str = ADMIN) -> httpx.Response:
    async with server.client(key) as client:
        return await client.patch("/v1/admin/config", json=change)


async def _stream_chunks(server: Server, max_tokens: int, key: str = ACME) -> tuple[int, int]:
    """(content chunks, completion tokens) of one streamed chat completion."""
    body = {
        "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks, tokens = 0, 0
    async with (
        server.client(key) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                chunks += 1
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return chunks, tokens


async def test_get_shows_the_settings_with_secrets_masked_and_the_live_keys(server) -> None:
    async with server.client() as client:
        answer = (await client.get("/v1/admin/config")).json()
    assert answer["object"] == "config"
    assert answer["config"]["scheduler"]["max_batch_tokens"] == 256
    assert {key["key"] for key in answer["config"]["auth"]["api_keys"]} == {"***"}
    assert answer["config"]["auth"]["pepper"] == "***"
    assert ADMIN not in json.dumps(answer) and PEPPER not in json.dumps(answer)
    assert "scheduler.stream_interval" in answer["live"]
    assert "scheduler.max_num_seqs" not in answer["live"]


async def test_only_the_admin_scope_reads_or_changes_the_config(server) -> None:
    async with server.client(ACME) as client:
        assert (await client.get("/v1/admin/config")).status_code == 403
        denied = await client.patch("/v1/admin/config", json={"scheduler": {"aging_s": 1}})
    assert denied.status_code == 403
    async with httpx.AsyncClient(base_url=server.url) as anonymous:
        assert (await anonymous.get("/v1/admin/config")).status_code == 401


async def test_a_restart_only_key_is_a_409_and_nothing_changes(server) -> None:
    answer = await _patch(server, {"scheduler": {"max_num_seqs": 4, "stream_interval": 3}})
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("restart_required", "scheduler.max_num_seqs")
    assert "restart" in error["message"]
    above = await _patch(server, {"scheduler": {"max_batch_tokens": 512}})
    assert above.status_code == 409 and "256" in above.json()["error"]["message"]
    policy = await _patch(server, {"guardrails": {"blocklist": ["x"]}})
    assert policy.status_code == 409 and "/v1/admin/guardrails" in policy.json()["error"]["message"]
    async with server.client() as client:
        config = (await client.get("/v1/admin/config")).json()["config"]
    assert config["scheduler"]["stream_interval"] == 1
    assert config["scheduler"]["max_num_seqs"] == 1


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"scheduler": {"stream_interval": 0}}, "scheduler.stream_interval"),
        ({"scheduler": {"stream_interval": "many"}}, "scheduler.stream_interval"),
        ({"scheduler": {"low_watermark": 5000}}, "scheduler"),
        ({"schedulr": {"aging_s": 1}}, "schedulr"),
        ({"scheduler": 7}, "scheduler"),
    ],
)
async def test_a_bad_change_is_a_400_naming_the_setting(server, change, param) -> None:
    answer = await _patch(server, change)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


async def test_malformed_json_and_a_non_object_are_400(server) -> None:
    async with server.client() as client:
        for raw in (b"{", b"[1, 2]", b'"x"'):
            answer = await client.patch(
                "/v1/admin/config", content=raw, headers={"content-type": "application/json"}
            )
            assert answer.status_code == 400, raw
            assert answer.json()["error"]["type"] == "invalid_request_error"


async def test_stream_interval_changes_how_tokens_are_sent(server) -> None:
    chunks, tokens = await _stream_chunks(server, 24)
    assert tokens >= 12 and chunks >= tokens - 2  # about one chunk per token
    answer = await _patch(server, {"scheduler": {"stream_interval": 6}})
    assert answer.status_code == 200
    assert answer.json()["changed"] == ["scheduler.stream_interval"]
    try:
        chunks, tokens = await _stream_chunks(server, 24)
        assert tokens >= 12 and chunks <= tokens // 6 + 3
    finally:
        assert (await _patch(server, {"scheduler": {"stream_interval": 1}})).status_code == 200
    events = [json.loads(line) for line in server.audit_path.read_text().splitlines()]
    changes = [e for e in events if e.get("event") == "admin_change"]
    assert changes[-1]["action"] == "config.update"
    assert changes[-1]["details"]["values"] == {"scheduler.stream_interval": 1}


def _steps_over_32(metrics: str) -> float:
    """Engine steps of more than 32 tokens so far (the batch-tokens histogram)."""
    total = le_32 = 0.0
    for line in metrics.splitlines():
        if line.startswith("inferflux_batch_tokens_bucket"):
            value = float(line.rsplit(" ", 1)[1])
            if 'le="+Inf"' in line:
                total += value
            elif 'le="32.0"' in line:
                le_32 += value
    return total - le_32


async def _prefill(server: Server) -> None:
    async with server.client(ACME) as client:
        answer = await client.post(
            "/v1/completions",
            json={"prompt": LONG_PROMPT, "max_tokens": 2},
        )
    assert answer.status_code == 200
    assert answer.json()["usage"]["prompt_tokens"] > 100


async def test_max_batch_tokens_bounds_every_engine_step_at_once(server) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        before = _steps_over_32((await client.get("/metrics")).text)
        await _prefill(server)  # a prompt of 100+ tokens: steps of up to 256 tokens
        between = _steps_over_32((await client.get("/metrics")).text)
        assert between > before
        assert (await _patch(server, {"scheduler": {"max_batch_tokens": 32}})).status_code == 200
        try:
            await _prefill(server)  # now chunked into steps of 32 tokens at most
            after = _steps_over_32((await client.get("/metrics")).text)
        finally:
            await _patch(server, {"scheduler": {"max_batch_tokens": 256}})
    assert after == between


async def _generation(server: Server, max_tokens: int) -> int:
    async with server.client(ACME) as client:
        answer = await client.post(
            "/v1/completions",
            json={"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True},
        )
    return answer.status_code


async def _second_while_first_runs(server: Server) -> list[int]:
    """Start a long generation (the one sequence slot), then two more requests while it
    runs; the statuses of those two."""
    first = asyncio.create_task(_generation(server, 600))  # seconds on a busy CPU
    await asyncio.sleep(0.5)
    queued = asyncio.create_task(_generation(server, 8))
    await asyncio.sleep(0.3)
    third = await _generation(server, 8)
    statuses = [await queued, third]
    assert await first == 200
    return statuses


async def test_watermarks_change_when_backpressure_starts(server) -> None:
    assert await _second_while_first_runs(server) == [200, 200]
    change = {"scheduler": {"high_watermark": 1, "low_watermark": 0}}
    assert (await _patch(server, change)).status_code == 200
    try:
        statuses = await _second_while_first_runs(server)
    finally:
        await _patch(server, {"scheduler": {"high_watermark": 1000, "low_watermark": 500}})
    assert statuses == [200, 503]  # the third found one queued: at the high watermark


async def test_queue_timeout_applies_to_requests_queued_after_the_change(server) -> None:
    assert (await _patch(server, {"scheduler": {"queue_timeout_s": 0.2}})).status_code == 200
    try:
        statuses = await _second_while_first_runs(server)
    finally:
        await _patch(server, {"scheduler": {"queue_timeout_s": 30}})
    assert statuses == [408, 408]  # both waited behind the running one for over 0.2 s


def _generation_lines(server: Server, tenant: str, after: int) -> list[dict[str, Any]]:
    """The per-generation log lines of `tenant` after the first `after` JSON lines."""
    return [
        line
        for line in server.log_lines()[after:]
        if line.get("tenant") == tenant and re.match(r"generation \S+ ", line["msg"])
    ]


async def _logged(server: Server, key: str) -> int:
    """Lines logged so far, after a short generation by `key` settled in the log."""
    await _stream_chunks(server, 4, key=key)
    await asyncio.sleep(0.5)  # the server writes its log as lines come
    return len(server.log_lines())


async def test_log_level_and_tenant_logging_change_what_is_logged(server) -> None:
    change = {
        "observability": {
            "log_level": "warning",
            "tenant_logging": {"acme": {"log_level": "info"}},
        }
    }
    answer = await _patch(server, change)
    assert answer.status_code == 200
    assert set(answer.json()["changed"]) == {
        "observability.log_level",
        "observability.tenant_logging",
    }
    try:
        mark = len(server.log_lines())
        end = await _logged(server, ACME)
        assert _generation_lines(server, "acme", mark)
        await _logged(server, GLOBEX)
        assert not _generation_lines(server, "globex", end)
        sampled = {"observability": {"tenant_logging": {"acme": {"log_sample_rate": 0.0}}}}
        assert (await _patch(server, sampled)).status_code == 200
        mark = len(server.log_lines())
        await _logged(server, ACME)
        assert not _generation_lines(server, "acme", mark)
    finally:
        reset = {"observability": {"log_level": "info", "tenant_logging": {"acme": None}}}
        assert (await _patch(server, reset)).status_code == 200
    mark = len(server.log_lines())
    await _logged(server, GLOBEX)
    assert _generation_lines(server, "globex", mark)
