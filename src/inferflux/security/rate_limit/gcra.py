"""GCRA (the generic cell rate algorithm) and the in-memory limiter built on it.

Why GCRA: it is a token bucket (capacity = one minute's limit, refilled continuously at
limit/60 per second) stored as a single number per key, the theoretical arrival time
(TAT), with no refill timer. That makes the Redis version one GET and one SET inside a Lua
script, and it handles weighted costs (n tokens) and debts (completion tokens charged
after the fact push the TAT past the burst window, so later requests wait) without any
special case.

For a limit of L per minute, each unit costs an emission interval T = 60 s / L and the
burst tolerance is τ = 60 s (a whole minute's worth may arrive at once). A charge of n
units at time `now`: tat' = max(tat, now) + n·T; it is allowed when tat' − now ≤ τ, and
then stored. Remaining units = ⌊(τ − (tat − now)) / T⌋; the bucket is full again (reset)
after tat − now. A forced charge (reconciliation) stores tat' without the check.

Owns: `Charge`, `Slot`, `RateState`, `Decision` (the limiter contract, shared with the
Redis limiter) and `LocalLimiter`. Does not own which limits apply (`targets.py`) or what
happens when Redis fails (`limiter.py`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

WINDOW_S = 60.0  # limits are per minute; the burst tolerance is one window
_SWEEP_EVERY = 4096  # prune idle keys after this many charges

Backend = Literal["local", "redis", "none"]


@dataclass(frozen=True, slots=True)
class Charge:
    """`cost` units against `limit` per minute under `key` (cost 0: only read the state)."""

    key: str
    limit: int
    cost: int
    kind: Literal["requests", "tokens"]
    scope: str = "key"  # whose limit: "key" or "tenant" (for messages)


@dataclass(frozen=True, slots=True)
class Slot:
    """One concurrency slot under `key`, of at most `limit` held at once."""

    key: str
    limit: int
    scope: str = "key"


@dataclass(frozen=True, slots=True)
class RateState:
    """A charge's limit after the decision: units left now, seconds until full again."""

    kind: Literal["requests", "tokens"]
    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to `acquire`. When refused nothing was charged and no slot taken;
    `denied` says which limit refused (`requests`, `tokens` or `concurrency`)."""

    allowed: bool
    states: tuple[RateState, ...] = ()
    retry_after_s: float = 0.0
    denied: Literal["requests", "tokens", "concurrency"] | None = None
    backend: Backend = "none"  # who decided
    denied_scope: str | None = None  # the refusing limit's Charge/Slot scope


def state_of(charge: Charge, tat_minus_now_s: float) -> RateState:
    """The state of `charge`'s key given its TAT relative to now."""
    ahead = max(0.0, tat_minus_now_s)
    interval = WINDOW_S / charge.limit
    remaining = math.floor((WINDOW_S - ahead) / interval + 1e-9)
    return RateState(charge.kind, charge.limit, max(0, min(charge.limit, remaining)), ahead)


def retry_after(charge: Charge, tat_minus_now_s: float) -> float:
    """Seconds until `charge` would be allowed (its cost fits within one window)."""
    ahead = max(0.0, tat_minus_now_s)
    return max(0.0, ahead + charge.cost * WINDOW_S / charge.limit - WINDOW_S)


@dataclass(slots=True)
class LocalLimiter:
    """GCRA and concurrency slots in this process's memory. Not thread-safe: call it from
    one event loop (every method runs without awaiting, so each decision is atomic)."""

    clock: Callable[[], float] = time.monotonic
    _tat: dict[str, float] = field(default_factory=dict)
    _slots: dict[str, set[str]] = field(default_factory=dict)
    _num_charges: int = 0

    async def acquire(
        self, charges: Sequence[Charge], slots: Sequence[Slot], member: str
    ) -> Decision:
        return self.acquire_now(charges, slots, member)

    def acquire_now(
        self, charges: Sequence[Charge], slots: Sequence[Slot], member: str
    ) -> Decision:
        """Charge every `charges` and take every slot, or nothing if any limit refuses."""
        now = self.clock()
        self._sweep(now)
        new_tats: list[float] = []
        for charge in charges:
            tat = max(self._tat.get(charge.key, now), now)
            new_tat = tat + charge.cost * WINDOW_S / charge.limit
            if new_tat - now > WINDOW_S + 1e-9:
                return self._refused(charges, charge, now)
            new_tats.append(new_tat)
        for slot in slots:
            if len(self._slots.get(slot.key, ())) >= slot.limit:
                states = tuple(state_of(c, self._tat.get(c.key, now) - now) for c in charges)
                return Decision(False, states, 1.0, "concurrency", "local", slot.scope)
        for charge, new_tat in zip(charges, new_tats, strict=True):
            self._tat[charge.key] = new_tat
        for slot in slots:
            self._slots.setdefault(slot.key, set()).add(member)
        states = tuple(state_of(c, t - now) for c, t in zip(charges, new_tats, strict=True))
        return Decision(True, states, 0.0, None, "local")

    def _refused(self, charges: Sequence[Charge], refused: Charge, now: float) -> Decision:
        states = tuple(state_of(c, self._tat.get(c.key, now) - now) for c in charges)
        wait = retry_after(refused, self._tat.get(refused.key, now) - now)
        return Decision(False, states, wait, refused.kind, "local", refused.scope)

    async def charge(self, charges: Sequence[Charge]) -> tuple[RateState, ...]:
        """Forced charges (completion tokens already produced): no check, may go into
        debt, which later requests wait out."""
        now = self.clock()
        states = []
        for charge in charges:
            tat = max(self._tat.get(charge.key, now), now) + charge.cost * WINDOW_S / charge.limit
            self._tat[charge.key] = tat
            states.append(state_of(charge, tat - now))
        return tuple(states)

    async def release(self, slots: Sequence[Slot], member: str) -> None:
        for slot in slots:
            members = self._slots.get(slot.key)
            if members is not None:
                members.discard(member)
                if not members:
                    del self._slots[slot.key]

    async def close(self) -> None:
        return None

    def _sweep(self, now: float) -> None:
        """Forget keys whose bucket is full again (equivalent to never seen)."""
        self._num_charges += 1
        if self._num_charges % _SWEEP_EVERY == 0:
            self._tat = {k: t for k, t in self._tat.items() if t > now}
