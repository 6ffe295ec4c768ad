"""Redis stopped (SIGKILL) and restarted empty during rate-limited load: limits fall back
as configured (rate_limit.redis_failure_mode, `local` by default: each replica counts in
its own memory), nothing answers 500, and once Redis is back the limiter counts in Redis
again (`inferflux_rate_limit_redis_up` 1, keys in Redis, 429s from the shared limit)."""

from __future__ import annotations

import time

import httpx

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, Outcome, StreamLoad, between, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving, wait_until
from tests.integration.security_support import RedisServer

LIMIT_PER_MINUTE = 12
KEY_PREFIX = "chaos:rl"


def _redis_up(url: str) -> bool:
    try:
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return False
    return "inferflux_rate_limit_redis_up 1.0" in metrics


def _statuses(outcomes: list[Outcome]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for outcome in outcomes:
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return dict(sorted(counts.items()))


def redis_restarted(run: ChaosRun) -> list[FaultResult]:
    result = FaultResult(
        f"Redis killed and restarted under rate-limited load ({run.streams} streams)",
        target="0 lost, 0 500s; 200/429 only while Redis is down (local fallback); "
        "Redis counting again ≤ 10 s after it is back",
        passed=True,
    )
    started = time.monotonic()
    redis = RedisServer()
    env = {
        "INFERFLUX_REDIS_URL": redis.url,
        "INFERFLUX_RATE_LIMIT__REQUESTS_PER_MINUTE": str(LIMIT_PER_MINUTE),
        "INFERFLUX_RATE_LIMIT__KEY_PREFIX": KEY_PREFIX,
        "INFERFLUX_REDIS__RETRY_AFTER_S": "0.5",
    }
    phase_s = run.seconds(12)
    try:
        with serving(run.log_dir, "redis", env=env) as server:
            spec = LoadSpec(streams=run.streams, max_tokens=1, pause_after_failure_s=0.2)
            load = StreamLoad(server.url, spec).start()
            time.sleep(phase_s)
            redis.kill()
            down_at = time.monotonic()
            time.sleep(phase_s)
            redis = RedisServer(port=redis.port)
            back_at = time.monotonic()
            result.recovery_s = wait_until(lambda: _redis_up(server.url), 30)
            time.sleep(phase_s)
            outcomes = load.stop()
            num_keys = len(redis.client().keys(f"{KEY_PREFIX}*"))
    finally:
        redis.kill()
    result.count(tally(outcomes))
    phases = {
        "up": _statuses([o for o in outcomes if between(0, down_at)(o)]),
        "down": _statuses([o for o in outcomes if between(down_at, back_at)(o)]),
        "back": _statuses([o for o in outcomes if between(back_at, 1e18)(o)]),
    }
    result.notes.append(f"HTTP statuses per phase (Redis up, down, back): {phases}")
    result.notes.append(f"{num_keys} limiter keys in the restarted Redis")
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    result.check(set(phases["down"]) <= {200, 429}, "only 200/429 while Redis is down")
    result.check(result.recovery_s is not None and result.recovery_s <= 10, "Redis up again")
    result.check(num_keys > 0 and 429 in phases["back"], "limits counted in Redis again")
    result.duration_s = time.monotonic() - started
    return [result]
