"""Rate limits against the real app and model: requests per minute per key and per
tenant, tokens per minute (prompt at admission, completion reconciled as it streams and
on disconnect), concurrency, embeddings, and the x-ratelimit-* headers."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from inferflux.security.policy import RateLimits, TenantPolicy

pytestmark = pytest.mark.model


def act_as(key: str, tenant: str = "default") -> dict[str, str]:
    return {"x-test-principal": f"{key}-{uuid.uuid4().hex[:8]}@{tenant}"}


def chat(content: str = "Say hi.", max_tokens: int = 4, **extra) -> dict:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


async def test_requests_per_minute_per_key_with_openai_headers(secured):
    secured.source.set(default_limits=RateLimits(requests_per_minute=3))
    me, other = act_as("k1"), act_as("k2")
    async with secured.client() as client:
        for remaining in (2, 1, 0):
            response = await client.get("/v1/models", headers=me)
            assert response.status_code == 200
            assert response.headers["x-ratelimit-limit-requests"] == "3"
            assert response.headers["x-ratelimit-remaining-requests"] == str(remaining)
            assert response.headers["x-ratelimit-reset-requests"].endswith("s")
        refused = await client.post("/v1/chat/completions", headers=me, json=chat())
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        ollama = await client.post("/api/generate", headers=me, json={"prompt": "hi"})
        assert ollama.status_code == 429 and "rate limit" in ollama.json()["error"]
        assert (await client.get("/v1/models", headers=other)).status_code == 200
        assert (await client.get("/healthz", headers=me)).status_code == 200  # never limited


async def test_a_tenant_limit_is_shared_by_its_keys(secured):
    secured.source.set(tenants=(TenantPolicy("acme", limits=RateLimits(requests_per_minute=2)),))
    async with secured.client() as client:
        first = await client.get("/v1/models", headers=act_as("a", "acme"))
        second = await client.get("/v1/models", headers=act_as("b", "acme"))
        third = await client.get("/v1/models", headers=act_as("c", "acme"))
        elsewhere = await client.get("/v1/models", headers=act_as("d", "other"))
    assert [first.status_code, second.status_code, third.status_code] == [200, 200, 429]
    assert "tenant" in third.json()["error"]["message"]
    assert elsewhere.status_code == 200


async def test_prompt_tokens_are_refused_before_anything_is_queued(secured):
    secured.source.set(default_limits=RateLimits(tokens_per_minute=60))
    me = act_as("tpm")
    async with secured.client() as client:
        long_prompt = "Please summarize: " + "the quick brown fox jumps over the lazy dog " * 10
        refused = await client.post("/v1/chat/completions", headers=me, json=chat(long_prompt))
        assert refused.status_code == 429
        assert "exceed" in refused.json()["error"]["message"]
        stats = (await client.get("/debug/requests")).json()
        assert all(r.get("num_prompt_tokens", 0) < 100 for r in stats.get("requests", []))
        ok = await client.post("/v1/chat/completions", headers=me, json=chat("Hi", max_tokens=2))
        assert ok.status_code == 200
        assert int(ok.headers["x-ratelimit-remaining-tokens"]) < 60


async def test_completion_tokens_are_charged_as_they_stream(secured):
    limit = 6000
    secured.source.set(default_limits=RateLimits(tokens_per_minute=limit))
    me = act_as("recon")
    async with secured.client() as client:
        first = await client.post(
            "/v1/chat/completions", headers=me, json=chat("Tell me a story.", max_tokens=40)
        )
        usage = first.json()["usage"]
        second = await client.get("/v1/models", headers=me)  # reads, charges no tokens
    spent = usage["prompt_tokens"] + usage["completion_tokens"]
    remaining = int(second.headers["x-ratelimit-remaining-tokens"])
    refill = limit / 60 * 60  # generous: a minute of refill at most while the test ran
    assert limit - spent - 1 <= remaining <= min(limit, limit - spent + refill)
    assert remaining <= limit - usage["prompt_tokens"] - usage["completion_tokens"] + 200


async def test_a_disconnected_stream_is_charged_for_what_it_produced(secured):
    limit = 100_000
    secured.source.set(default_limits=RateLimits(tokens_per_minute=limit))
    me = act_as("cancel")
    async with secured.client() as client:
        body = chat("Count from one to one hundred.", max_tokens=200, stream=True, ignore_eos=True)
        chunks = 0
        async with client.stream("POST", "/v1/chat/completions", headers=me, json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                if chunks >= 20:
                    break
        await asyncio.sleep(0.5)
        after = await client.get("/v1/models", headers=me)
    remaining = int(after.headers["x-ratelimit-remaining-tokens"])
    # at least the 20 streamed tokens (and the prompt) were charged, not the 200 asked for
    assert remaining <= limit - 20 - 10 + 100  # + what refilled meanwhile
    assert remaining > limit - 200 - 200


async def test_max_concurrent_requests(secured):
    secured.source.set(default_limits=RateLimits(max_concurrent=1))
    me = act_as("conc")
    async with secured.client() as client:
        body = chat("Write a long poem.", max_tokens=300, ignore_eos=True)
        running = asyncio.create_task(client.post("/v1/chat/completions", headers=me, json=body))
        for _ in range(200):  # until the engine runs it (its slot is taken by then)
            if (await client.get("/server/stats")).json()["num_in_flight"]:
                break
            await asyncio.sleep(0.02)
        busy = await client.get("/v1/models", headers=me)
        assert (await running).status_code == 200
        assert busy.status_code == 429
        assert "concurrent" in busy.json()["error"]["message"]
        assert (await client.get("/v1/models", headers=me)).status_code == 200


async def test_embeddings_count_tokens(secured):
    secured.source.set(default_limits=RateLimits(tokens_per_minute=20))
    me = act_as("emb")
    async with secured.client() as client:
        big = await client.post("/v1/embeddings", headers=me, json={"input": "word " * 60})
        small = await client.post("/v1/embeddings", headers=me, json={"input": "hello"})
    assert big.status_code == 429
    assert small.status_code == 200, small.text
    assert int(small.headers["x-ratelimit-remaining-tokens"]) < 20


async def test_limits_off_by_default_and_no_headers(secured):
    async with secured.client() as client:
        response = await client.get("/v1/models", headers=act_as("free"))
    assert response.status_code == 200
    assert not any(name.startswith("x-ratelimit") for name in response.headers)
