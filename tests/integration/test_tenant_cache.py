"""Prefix-cache isolation: a tenant never gets cached tokens from another tenant's prompt
(CVE-2025-46570), unless both opt in to sharing."""

from __future__ import annotations

import pytest

from inferflux.security.policy import TenantPolicy

pytestmark = pytest.mark.model

PROMPT = "Here is a long shared preamble for caching. " * 6 + "Now say OK."


async def cached_tokens(client, tenant: str, prompt: str) -> int:
    response = await client.post(
        "/v1/chat/completions",
        headers={"x-test-principal": f"key-{tenant}@{tenant}"},
        json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_tenant_b_gets_no_cached_tokens_from_tenant_a(secured):
    prompt = "Tenant isolation check. " + PROMPT
    async with secured.client() as client:
        await cached_tokens(client, "tenant-a", prompt)
        assert await cached_tokens(client, "tenant-a", prompt) > 0  # A reuses its own
        assert await cached_tokens(client, "tenant-b", prompt) == 0  # B gets none of A's
        assert await cached_tokens(client, "tenant-b", prompt) > 0  # B reuses its own


async def test_tenants_that_opt_in_share_their_cache(secured):
    prompt = "Shared cache check. " + PROMPT
    secured.source.set(
        tenants=(
            TenantPolicy("share-1", share_prefix_cache=True),
            TenantPolicy("share-2", share_prefix_cache=True),
        )
    )
    async with secured.client() as client:
        await cached_tokens(client, "share-1", prompt)
        assert await cached_tokens(client, "share-2", prompt) > 0
