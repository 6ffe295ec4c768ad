"""`RedisLimiter`: the GCRA of `gcra.py` and concurrency slots in Redis, so every replica
that shares a Redis (and `rate_limit.key_prefix`) shares the limits.

Each decision is one Lua script run, atomic in Redis: it reads the clock with `TIME` (one
clock for all replicas), checks every charge and slot, and writes all of them or none.
Concurrency slots are sorted-set members scored by their lease expiry, so a replica that
dies while holding slots frees them after `rate_limit.concurrency_lease_s`.

Owns the scripts and their argument layout. Raises redis-py's `RedisError` (or
`TimeoutError`) when Redis cannot answer; `limiter.py` decides what happens then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from inferflux.security.rate_limit.gcra import (
    WINDOW_S,
    Charge,
    Decision,
    RateState,
    Slot,
    retry_after,
    state_of,
)

# KEYS: the charges' keys, then the slots' keys.
# ARGV: n_charges, n_slots, member, lease_ms, force (0/1), then limit and cost of each
#       charge, then the limit of each slot.
# Returns: {allowed (0/1), index of the refusing limit (1-based, 0 = none),
#           then TAT - now in µs of each charge (after the decision)}.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = 60000000
local n_charges = tonumber(ARGV[1])
local n_slots = tonumber(ARGV[2])
local member = ARGV[3]
local lease = tonumber(ARGV[4])
local force = ARGV[5] == '1'
local tats = {}
local new_tats = {}
local refused = 0
for i = 1, n_charges do
  local limit = tonumber(ARGV[4 + 2 * i])
  local cost = tonumber(ARGV[5 + 2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or now)
  if tat < now then tat = now end
  tats[i] = tat
  new_tats[i] = tat + cost * window / limit
  if (not force) and refused == 0 and new_tats[i] - now > window + 1 then
    refused = i
  end
end
local base = 5 + 2 * n_charges
if refused == 0 then
  for j = 1, n_slots do
    local key = KEYS[n_charges + j]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    if redis.call('ZCARD', key) >= tonumber(ARGV[base + j]) then
      refused = n_charges + j
      break
    end
  end
end
local result = {refused == 0 and 1 or 0, refused}
for i = 1, n_charges do
  local tat = tats[i]
  if refused == 0 then
    tat = new_tats[i]
    local ttl = math.ceil((tat - now) / 1000) + 1000
    redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', ttl)
  end
  result[#result + 1] = math.floor(tat - now)
end
if refused == 0 then
  for j = 1, n_slots do
    local key = KEYS[n_charges + j]
    redis.call('ZADD', key, now + lease * 1000, member)
    redis.call('PEXPIRE', key, lease + 1000)
  end
end
return result
"""

_RELEASE = """
for i = 1, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[1])
end
return 1
"""


class RedisLimiter:
    """The limiter contract over one Redis (see `gcra.LocalLimiter` for the semantics)."""

    def __init__(self, client: Redis, *, lease_s: float) -> None:
        self._client = client
        self._lease_ms = int(lease_s * 1000)
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)

    async def acquire(
        self, charges: Sequence[Charge], slots: Sequence[Slot], member: str
    ) -> Decision:
        result = await self._run(charges, slots, member, force=False)
        allowed, refused = int(result[0]), int(result[1])
        states = _states(charges, result[2:])
        if allowed:
            return Decision(True, states, 0.0, None, "redis")
        if refused <= len(charges):
            charge = charges[refused - 1]
            ahead_s = int(result[1 + refused]) / 1e6
            wait = retry_after(charge, ahead_s)
            return Decision(False, states, wait, charge.kind, "redis", charge.scope)
        slot = slots[refused - len(charges) - 1]
        return Decision(False, states, 1.0, "concurrency", "redis", slot.scope)

    async def charge(self, charges: Sequence[Charge]) -> tuple[RateState, ...]:
        result = await self._run(charges, (), "", force=True)
        return _states(charges, result[2:])

    async def release(self, slots: Sequence[Slot], member: str) -> None:
        if slots:
            await self._release(keys=[s.key for s in slots], args=[member])

    async def close(self) -> None:
        await self._client.aclose()

    async def _run(
        self, charges: Sequence[Charge], slots: Sequence[Slot], member: str, *, force: bool
    ) -> list[Any]:  # Any: the script's reply, a list of integers
        args: list[str | int] = [len(charges), len(slots), member, self._lease_ms, int(force)]
        for charge in charges:
            args += [charge.limit, charge.cost]
        args += [slot.limit for slot in slots]
        keys = [c.key for c in charges] + [s.key for s in slots]
        reply = await self._acquire(keys=keys, args=args)
        return list(reply)


def _states(charges: Sequence[Charge], ahead_us: Sequence[Any]) -> tuple[RateState, ...]:
    return tuple(
        state_of(charge, int(ahead) / 1e6) for charge, ahead in zip(charges, ahead_us, strict=True)
    )


__all__ = ["WINDOW_S", "RedisLimiter"]
