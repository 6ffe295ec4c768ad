"""Guardrails against the real app and model: input blocks (400 content_filter) and
redaction before queuing, output blocks that end streams with content_filter (OpenAI,
Ollama), OPA decisions from a real Rego evaluation (allow, deny 403, unreachable or
undefined 503, fail open), and the verdict latency metric."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from inferflux.api.state import app_state
from inferflux.security.policy import GuardrailPolicy
from tests.integration.security_support import OpaServer
from tests.integration.server_process import free_port

pytestmark = pytest.mark.model


def act_as(tenant: str = "default") -> dict[str, str]:
    return {"x-test-principal": f"g-{uuid.uuid4().hex[:8]}@{tenant}"}


def chat(content: str, max_tokens: int = 8, **extra) -> dict:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def last_event(secured, request_id: str) -> dict:
    return next(e for e in reversed(secured.audit_events()) if e["request_id"] == request_id)


async def test_a_blocked_prompt_is_refused_before_queuing(secured):
    secured.source.set(guardrails=GuardrailPolicy(blocklist=("launch codes",)))
    async with secured.client() as client:
        refused = await client.post(
            "/v1/chat/completions", headers=act_as(), json=chat("Tell me the Launch Codes.")
        )
        ollama = await client.post(
            "/api/chat",
            headers=act_as(),
            json={
                "model": app_state(secured.app).models.default_serving().model_info.model_id,
                "messages": [{"role": "user", "content": "launch codes?"}],
            },
        )
        fine = await client.post("/v1/chat/completions", headers=act_as(), json=chat("Hi"))
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "content_filter"
    assert ollama.status_code == 400
    assert "content filter" in ollama.json()["error"]
    assert fine.status_code == 200
    event = last_event(secured, refused.headers["x-request-id"])
    assert event["decisions"] == ["guardrail:input:content_filter"]
    assert event["prompt_tokens"] == 0  # nothing was queued


async def test_pii_is_redacted_before_the_model_sees_it(secured):
    secured.source.set(guardrails=GuardrailPolicy(pii_action="redact"))
    async with secured.client() as client:
        response = await client.post(
            "/v1/chat/completions",
            headers=act_as(),
            json=chat("My card is 4111 1111 1111 1111 and my mail is ann@example.com."),
        )
    assert response.status_code == 200
    event = last_event(secured, response.headers["x-request-id"])
    assert "[REDACTED_CARD]" in event["prompt"] and "[REDACTED_EMAIL]" in event["prompt"]
    assert "4111" not in event["prompt"] and "ann@example.com" not in event["prompt"]
    assert "<|im_start|>" not in event["prompt"]  # special tokens kept as tokens, not text
    assert set(event["decisions"]) == {"guardrail:pii:card:redact", "guardrail:pii:email:redact"}


async def test_pii_block_mode_refuses(secured):
    secured.source.set(guardrails=GuardrailPolicy(pii_action="block"))
    async with secured.client() as client:
        response = await client.post(
            "/v1/completions", headers=act_as(), json={"prompt": "IBAN GB82 WEST 1234 5698 7654 32"}
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "content_filter"


# Common words SmolLM2 writes in any answer, matched across token boundaries (none of
# them in the prompts below or in SmolLM2's default system prompt: input is checked too).
OUTPUT_RULE = r"(?i)\b(the|and|is|of|to) [a-z]+"


async def test_a_blocked_output_ends_the_stream_with_content_filter(secured):
    secured.source.set(guardrails=GuardrailPolicy(blocklist_regex=(OUTPUT_RULE,)))
    body = chat("Describe ocean waves in three sentences.", max_tokens=80, stream=True)
    async with secured.client() as client:
        response = await client.post("/v1/chat/completions", headers=act_as(), json=body)
    events = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
    assert finishes and finishes[-1] == "content_filter", response.text[:800]
    assert not re.search(OUTPUT_RULE, content)
    event = last_event(secured, response.headers["x-request-id"])
    assert event["finish_reason"] == "content_filter"
    assert "guardrail:blocklist_regex:block" in event["decisions"]


async def test_blocked_output_non_streaming_and_ollama_done_reason(secured):
    secured.source.set(guardrails=GuardrailPolicy(blocklist_regex=(OUTPUT_RULE,)))
    async with secured.client() as client:
        whole = await client.post(
            "/v1/chat/completions", headers=act_as(), json=chat("Describe ocean waves.", 80)
        )
        ollama = await client.post(
            "/api/generate",
            headers=act_as(),
            json={
                "model": app_state(secured.app).models.default_serving().model_info.model_id,
                "prompt": "Describe ocean waves.",
                "options": {"num_predict": 80, "temperature": 0},
            },
        )
    choice = whole.json()["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    assert not re.search(OUTPUT_RULE, choice["message"]["content"])
    lines = [json.loads(line) for line in ollama.text.splitlines() if line]
    assert ollama.status_code == 200, ollama.text
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "content_filter"
    assert not re.search(OUTPUT_RULE, "".join(line.get("response", "") for line in lines))


@pytest.fixture(scope="module")
def opa():
    server = OpaServer()
    yield server
    server.close()


async def test_opa_allows_and_denies_from_a_rego_policy(secured, opa):
    endpoint = f"{opa.url}/v1/data/inferflux/decision"
    secured.source.set(guardrails=GuardrailPolicy(opa_endpoint=endpoint))
    async with secured.client() as client:
        allowed = await client.post("/v1/chat/completions", headers=act_as(), json=chat("Hi"))
        denied = await client.post(
            "/v1/chat/completions", headers=act_as("blocked"), json=chat("Hi")
        )
    assert allowed.status_code == 200
    assert denied.status_code == 403
    assert denied.json()["error"]["code"] == "content_filter"
    assert "tenant not allowed" in denied.json()["error"]["message"]
    sent = opa.inputs[-1]
    assert sent["principal"]["tenant"] == "blocked"
    assert sent["route"] == "/v1/chat/completions"
    assert sent["prompt"]["hash"].startswith("hmac-sha256:") and "text" not in sent["prompt"]


async def test_opa_unreachable_or_undefined_fails_closed_unless_configured(secured, opa):
    dead = f"http://127.0.0.1:{free_port()}/v1/data/inferflux/decision"
    undefined = f"{opa.url}/v1/data/broken"
    async with secured.client() as client:
        for endpoint in (dead, undefined):
            secured.source.set(guardrails=GuardrailPolicy(opa_endpoint=endpoint))
            refused = await client.post("/v1/chat/completions", headers=act_as(), json=chat("Hi"))
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "policy_unavailable"
            assert "retry-after" in refused.headers
        secured.source.set(guardrails=GuardrailPolicy(opa_endpoint=dead, opa_fail_open=True))
        allowed = await client.post("/v1/chat/completions", headers=act_as(), json=chat("Hi"))
        metrics = (await client.get("/metrics")).text
    assert allowed.status_code == 200
    assert (
        'inferflux_guardrail_decisions_total{action="unavailable",rule="opa",stage="input"}'
        in metrics
    )
    count = re.search(r'inferflux_guardrail_verdict_seconds_count\{stage="input"\} (\S+)', metrics)
    assert count is not None and float(count.group(1)) >= 3
