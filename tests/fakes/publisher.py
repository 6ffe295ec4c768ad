"""`FakePublisher`: a `PolicyPublisher` over an in-memory "cluster" (the newest published
policy), for unit tests of `LivePolicy`'s replicated commit (compare and set, rebase).
It has no Redis: the real one is tested in tests/integration/test_policy_replication.py."""

from __future__ import annotations

from inferflux.errors import PolicyUnavailable
from inferflux.security.policy import Policy


class FakePublisher:
    """Publishes iff the cluster holds no version above the base, like the Lua script."""

    def __init__(self, cluster: Policy | None = None) -> None:
        self.cluster = cluster or Policy()
        self.down = False
        self.published: list[int] = []

    async def publish(self, policy: Policy, base_version: int) -> Policy | None:
        if self.down:
            raise PolicyUnavailable("policy replication unavailable")
        if self.cluster.version > base_version or policy.version <= self.cluster.version:
            return self.cluster
        self.cluster = policy
        self.published.append(policy.version)
        return None
