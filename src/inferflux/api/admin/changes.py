"""What every admin route shares: the security state, and applying a change with its actor.

`apply_change` runs one policy change through `LivePolicy.update` (persisted before it is
published), logs it with the actor, and adds `admin:<actor>:<change>` to the request's
audit record and an `admin_change` event to the audit log when it runs. Descriptions
name ids, never secrets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import Request

from inferflux.api.security_layer import SecurityState
from inferflux.api.state import SecurityDep, app_state
from inferflux.security.context import context_of
from inferflux.security.policy import Policy

logger = logging.getLogger(__name__)


__all__ = ["SecurityDep", "actor_of", "apply_change", "record_change"]


def actor_of(request: Request) -> str:
    """`kind:subject` of the caller (a key id or a token subject; never a secret)."""
    principal = context_of(request.scope).caller
    return f"{principal.kind}:{principal.subject}"


async def apply_change(
    request: Request, security: SecurityState, change: str, update: Callable[[Policy], Policy]
) -> Policy:
    """Apply `update` to the stored policy; returns the new current policy. Raises what
    `update` raises (nothing changes then) or PolicyUnavailable (the store failed)."""
    policy = await security.policy.update(update)
    record_change(request, change, {"policy_version": policy.version})
    return policy


def record_change(request: Request, change: str, details: dict[str, object]) -> None:
    """Log an applied admin change (`action:target`) with its actor, note it on the
    request's audit record and write an `admin_change` audit event. No secret in
    `details`."""
    actor = actor_of(request)
    logger.info("admin change by %s: %s %s", actor, change, details)
    context = context_of(request.scope)
    context.record.policy_decisions.append(f"admin:{actor}:{change}")
    audit = app_state(request.app).security_layer.audit
    if audit is not None:
        action, _, target = change.partition(":")
        audit.admin_change(context.caller, action, target, details)
