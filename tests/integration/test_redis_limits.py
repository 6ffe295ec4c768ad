"""Rate limits shared through a real redis-server: the Lua limiter itself, two
`inferflux serve` processes that share one key's limit (within ±5% of one limit, not
twice it), and Redis dying mid-test (the configured failure mode: no 500, no hang)."""

from __future__ import annotations

import time

import httpx
import pytest

from inferflux.config.security_settings import RateLimitSettings, RedisSettings
from inferflux.errors import PolicyUnavailable
from inferflux.security.rate_limit import Charge, FailoverLimiter, RedisLimiter, Slot
from inferflux.security.rate_limit.limiter import make_rate_limiter
from tests.integration.security_support import RedisServer
from tests.integration.server_process import ServerProcess

LIMIT = 40  # requests per minute shared by both servers


async def test_the_lua_limiter_is_all_or_nothing(redis_server):
    limiter = make_rate_limiter(
        RedisSettings(url=redis_server.url), RateLimitSettings(key_prefix="t:lua")
    )
    assert isinstance(limiter, FailoverLimiter) and isinstance(limiter.redis, RedisLimiter)
    try:
        tokens = Charge("t:lua:tok", 600, 500, "tokens")
        first = await limiter.acquire([tokens], [Slot("t:lua:c", 1)], "m1")
        assert first.allowed and first.backend == "redis" and first.states[0].remaining == 100
        refused = await limiter.acquire([Charge("t:lua:rpm", 10, 1, "requests"), tokens], (), "m2")
        assert not refused.allowed and refused.denied == "tokens"
        assert refused.retry_after_s == pytest.approx(40.0, abs=1.0)
        again = await limiter.acquire([Charge("t:lua:rpm", 10, 1, "requests")], (), "m3")
        assert again.states[0].remaining == 9  # the refused request charged nothing
        busy = await limiter.acquire((), [Slot("t:lua:c", 1)], "m4")
        assert not busy.allowed and busy.denied == "concurrency"
        await limiter.release([Slot("t:lua:c", 1)], "m1")
        assert (await limiter.acquire((), [Slot("t:lua:c", 1)], "m4")).allowed
        debt = await limiter.charge([Charge("t:lua:tok", 600, 700, "tokens")])
        assert debt[0].remaining == 0 and debt[0].reset_s > 60
    finally:
        await limiter.close()


async def test_closed_and_open_modes_when_redis_is_unreachable():
    dead = RedisServer()
    dead.kill()
    for mode, expect in (("closed", "refused"), ("open", "allowed"), ("local", "allowed")):
        limiter = make_rate_limiter(
            RedisSettings(url=dead.url, timeout_s=0.2),
            RateLimitSettings(redis_failure_mode=mode),
        )
        started = time.monotonic()
        try:
            decision = await limiter.acquire([Charge("k", 1, 1, "requests")], (), "m")
            outcome = "allowed" if decision.allowed else "denied"
        except PolicyUnavailable:
            outcome = "refused"
        finally:
            await limiter.close()
        assert outcome == expect, mode
        assert time.monotonic() - started < 2.0  # a timeout, never a hang


def _count_accepted(urls: list[str], num_requests: int) -> tuple[int, set[int]]:
    statuses: set[int] = set()
    accepted = 0
    with httpx.Client(timeout=10) as client:
        for i in range(num_requests):
            status = client.get(f"{urls[i % len(urls)]}/v1/models").status_code
            statuses.add(status)
            accepted += status == 200
    return accepted, statuses


@pytest.mark.server
def test_two_servers_share_one_limit_through_redis(tmp_path):
    redis_server = RedisServer()
    env = {
        "INFERFLUX_REDIS_URL": redis_server.url,
        "INFERFLUX_RATE_LIMIT__REQUESTS_PER_MINUTE": str(LIMIT),
        "INFERFLUX_RATE_LIMIT__KEY_PREFIX": "t:two",
        "INFERFLUX_REDIS__RETRY_AFTER_S": "0.5",
    }
    servers = [ServerProcess(env=env, log_path=tmp_path / f"server-{i}.log") for i in range(2)]
    try:
        for server in servers:
            server.wait_ready(180)
        urls = [s.url for s in servers]
        started = time.monotonic()
        accepted, statuses = _count_accepted(urls, 3 * LIMIT)
        elapsed = time.monotonic() - started
        refill = elapsed * LIMIT / 60  # GCRA refills continuously while we send
        assert statuses == {200, 429}
        assert abs(accepted - LIMIT - refill) <= 0.05 * LIMIT + 1, (accepted, elapsed)

        # Redis dies: each server falls back to its own local limit (the default mode),
        # logs it once, answers every request (200 or 429, never 500) without hanging.
        redis_server.kill()
        started = time.monotonic()
        accepted, statuses = _count_accepted(urls, 2 * LIMIT)
        assert statuses <= {200, 429} and accepted > 0
        assert time.monotonic() - started < 30
        with httpx.Client(timeout=10) as client:
            metrics = client.get(f"{urls[0]}/metrics").text
        assert "inferflux_rate_limit_redis_up 0.0" in metrics
        assert 'inferflux_rate_limit_fallback_decisions_total{mode="local"}' in metrics
    finally:
        for server in servers:
            server.close()
        redis_server.kill()
    logs = (tmp_path / "server-0.log").read_text(errors="replace")
    assert logs.count("is unreachable") == 1  # once per outage, not once per request
