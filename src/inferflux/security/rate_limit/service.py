"""`RateLimitService`: which limits apply to a principal, and the three moments a request
meets them: admission (requests per minute, concurrency), its prompt tokens (checked
before anything is queued) and its completion tokens (charged as they stream, and on
cancel; never refused, they are already spent).

Which limits: per key, the key's own limits (`ApiKeyRecord.limits`), else its tier's
(`rate_limit_tier` → `Policy.tiers`), else `Policy.default_limits`; a principal without
a key record (OIDC, anonymous) gets its tier's or the defaults. Per tenant, the
`TenantPolicy.limits` of a tenant listed in `Policy.tenants` (an unlisted tenant has no
tenant-wide limit). A request must fit both. The policy is read on every decision, so an
admin change applies to the next request.

Owns `RateLimitStatus` (what the `x-ratelimit-*` headers say; one per request, in a
contextvar) and `RateLimitService`. Does not own storage (`limiter.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import quote

from inferflux.config.security_settings import RateLimitSettings
from inferflux.errors import RateLimited
from inferflux.security.policy import Policy, PolicySource, RateLimits
from inferflux.security.principal import Principal
from inferflux.security.rate_limit.gcra import Charge, Decision, RateState, Slot
from inferflux.security.rate_limit.limiter import RateLimiter

Kind = Literal["requests", "tokens"]


@dataclass(frozen=True, slots=True)
class Target:
    """One set of limits a request counts against: a key's (subject's) or a tenant's."""

    scope: Literal["key", "tenant"]
    name: str
    tenant: str
    limits: RateLimits


def targets_for(principal: Principal, policy: Policy) -> tuple[Target, ...]:
    """The limits that apply to `principal` (see the module docstring), unlimited ones
    left out."""
    record = None
    if principal.kind == "api_key":
        record = next((k for k in policy.keys if k.key_id == principal.subject), None)
    tier = principal.rate_limit_tier or (record.rate_limit_tier if record else None)
    tiers = dict(policy.tiers)
    if record is not None and record.limits is not None:
        key_limits = record.limits
    elif tier is not None and tier in tiers:
        key_limits = tiers[tier]
    else:
        key_limits = policy.default_limits
    targets = [Target("key", f"{principal.kind}:{principal.subject}", principal.tenant, key_limits)]
    tenant = next((t for t in policy.tenants if t.tenant == principal.tenant), None)
    if tenant is not None:
        targets.append(Target("tenant", principal.tenant, principal.tenant, tenant.limits))
    return tuple(t for t in targets if _limited(t.limits))


def _limited(limits: RateLimits) -> bool:
    return any(
        v is not None
        for v in (limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrent)
    )


@dataclass(slots=True)
class RateLimitStatus:
    """The tightest request and token limits of one request, as last seen (mutable; one
    event loop). Renders OpenAI's `x-ratelimit-*` headers."""

    requests: RateState | None = None
    tokens: RateState | None = None

    def update(self, states: tuple[RateState, ...]) -> None:
        """Keep, per kind, the state of `states` with the fewest units left."""
        for kind in ("requests", "tokens"):
            of_kind = [s for s in states if s.kind == kind]
            if of_kind:
                tightest = min(of_kind, key=lambda s: (s.remaining, -s.reset_s))
                setattr(self, kind, tightest)

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind, state in (("requests", self.requests), ("tokens", self.tokens)):
            if state is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(state.limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(state.remaining)
                headers[f"x-ratelimit-reset-{kind}"] = duration(state.reset_s)
        return headers


def duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s"


class RateLimitEvents(Protocol):
    """What the service reports (the metrics exporter implements it)."""

    def on_decision(self, kind: str, allowed: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class Admission:
    """A request let in: the concurrency slots it holds until `release`."""

    slots: tuple[Slot, ...] = ()
    member: str = ""


@dataclass(slots=True)
class RateLimitService:
    limiter: RateLimiter
    source: PolicySource
    settings: RateLimitSettings
    events: RateLimitEvents | None = None

    def targets(self, principal: Principal) -> tuple[Target, ...]:
        if not self.settings.enabled:
            return ()
        return targets_for(principal, self.source.current())

    async def admit(self, principal: Principal, member: str, status: RateLimitStatus) -> Admission:
        """Count one request against requests per minute and take its concurrency slots;
        read (not charge) the token limits for the headers. Raises RateLimited (429),
        or PolicyUnavailable (503) when Redis is down in `closed` mode."""
        targets = self.targets(principal)
        charges = [self._charge(t, "requests", 1) for t in targets]
        charges += [self._charge(t, "tokens", 0) for t in targets]
        present = [c for c in charges if c is not None]
        slots = tuple(
            Slot(self._key(t, "conc"), t.limits.max_concurrent, t.scope)
            for t in targets
            if t.limits.max_concurrent is not None
        )
        if not present and not slots:
            return Admission()
        decision = await self.limiter.acquire(present, slots, member)
        status.update(decision.states)
        self._report(decision, has_slots=bool(slots), charges=present)
        if not decision.allowed:
            raise self._refusal(decision, status)
        return Admission(slots, member)

    async def release(self, admission: Admission) -> None:
        if admission.slots:
            await self.limiter.release(admission.slots, admission.member)

    async def charge_prompt(
        self, principal: Principal, num_tokens: int, status: RateLimitStatus | None
    ) -> None:
        """Check and charge a prompt's tokens. Raises RateLimited (429) when they do not
        fit, before anything is queued; a prompt larger than a whole minute's tokens can
        never fit, and says so."""
        charges = [self._charge(t, "tokens", num_tokens) for t in self.targets(principal)]
        present = [c for c in charges if c is not None]
        if not present:
            return
        status = status if status is not None else RateLimitStatus()
        for charge in present:
            if charge.cost > charge.limit:
                raise RateLimited(
                    f"this request's {charge.cost} prompt tokens exceed the {charge.scope} "
                    f"limit of {charge.limit} tokens per minute; shorten the prompt",
                    retry_after_s=60.0,
                    limit_headers=status.headers(),
                )
        decision = await self.limiter.acquire(present, (), "")
        status.update(decision.states)
        self._report(decision, has_slots=False, charges=present)
        if not decision.allowed:
            raise self._refusal(decision, status)

    async def charge_completion(
        self, principal: Principal, num_tokens: int, status: RateLimitStatus | None
    ) -> None:
        """Charge tokens already generated (never refused; the key may go into debt)."""
        if num_tokens <= 0:
            return
        charges = [self._charge(t, "tokens", num_tokens) for t in self.targets(principal)]
        present = [c for c in charges if c is not None]
        if present:
            states = await self.limiter.charge(present)
            if status is not None:
                status.update(states)

    def _charge(self, target: Target, kind: Kind, cost: int) -> Charge | None:
        limits = target.limits
        limit = limits.requests_per_minute if kind == "requests" else limits.tokens_per_minute
        if limit is None:
            return None
        short = "rpm" if kind == "requests" else "tpm"
        return Charge(self._key(target, short), limit, cost, kind, target.scope)

    def _key(self, target: Target, what: str) -> str:
        # {tenant} is a Redis Cluster hash tag: one request's keys share a slot.
        tenant = quote(target.tenant, safe="")
        return f"{self.settings.key_prefix}:{{{tenant}}}:{what}:{target.scope}:" + quote(
            target.name, safe=""
        )

    def _report(self, decision: Decision, *, has_slots: bool, charges: list[Charge]) -> None:
        if self.events is None:
            return
        kinds: set[str] = {c.kind for c in charges if c.cost > 0}
        if has_slots:
            kinds.add("concurrency")
        for kind in sorted(kinds):
            self.events.on_decision(kind, decision.allowed or decision.denied != kind)

    @staticmethod
    def _refusal(decision: Decision, status: RateLimitStatus) -> RateLimited:
        whose = "caller (API key or user)" if decision.denied_scope == "key" else "tenant"
        what = {
            "requests": "requests per minute",
            "tokens": "tokens per minute",
            "concurrency": "concurrent requests",
        }[decision.denied or "requests"]
        wait = max(decision.retry_after_s, 0.001)
        return RateLimited(
            f"rate limit of {what} reached for this {whose}; retry in {duration(wait)}",
            retry_after_s=wait,
            limit_headers=status.headers(),
        )
