"""Rate limits per key and per tenant: requests and tokens per minute (GCRA) and
concurrent requests, in memory or in Redis shared by replicas."""

from inferflux.security.rate_limit.gcra import (
    Charge,
    Decision,
    LocalLimiter,
    RateState,
    Slot,
)
from inferflux.security.rate_limit.limiter import (
    FailoverLimiter,
    LimiterEvents,
    RateLimiter,
    make_rate_limiter,
)
from inferflux.security.rate_limit.middleware import RateLimitMiddleware
from inferflux.security.rate_limit.redis_limiter import RedisLimiter
from inferflux.security.rate_limit.service import (
    RateLimitEvents,
    RateLimitService,
    RateLimitStatus,
    Target,
    targets_for,
)

__all__ = [
    "Charge",
    "Decision",
    "FailoverLimiter",
    "LimiterEvents",
    "LocalLimiter",
    "RateLimitEvents",
    "RateLimitMiddleware",
    "RateLimitService",
    "RateLimitStatus",
    "RateLimiter",
    "RateState",
    "RedisLimiter",
    "Slot",
    "Target",
    "make_rate_limiter",
    "targets_for",
]
