"""What every admin route shares: the security state, and applying a change with its actor.

`apply_change` runs one policy change through `LivePolicy.update` (persisted before it is
published), logs it with the actor, and adds `admin:<actor>:<change>` to the request's
audit record and an `admin_change` event to the audit log when it runs. Descriptions
name ids, never secrets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, cast

from fastapi import Depends, Request

from inferflux.api.security_stack import SecurityState
from inferflux.security.policy import Policy
from inferflux.security.principal import get_principal
from inferflux.security.request_record import get_request_record

logger = logging.getLogger(__name__)


def get_security(request: Request) -> SecurityState:
    return cast(SecurityState, request.app.state.security)


SecurityDep = Annotated[SecurityState, Depends(get_security)]


def actor_of(request: Request) -> str:
    """`kind:subject` of the caller (a key id or a token subject; never a secret)."""
    principal = get_principal(request.scope)
    return f"{principal.kind}:{principal.subject}"


async def apply_change(
    request: Request, security: SecurityState, change: str, update: Callable[[Policy], Policy]
) -> Policy:
    """Apply `update` to the stored policy; returns the new current policy. Raises what
    `update` raises (nothing changes then) or PolicyUnavailable (the store failed)."""
    policy = await security.policy.update(update)
    actor = actor_of(request)
    logger.info("admin change by %s: %s (policy version %d)", actor, change, policy.version)
    record = get_request_record(request.scope)
    if record is not None:
        record.policy_decisions.append(f"admin:{actor}:{change}")
    layer = getattr(request.app.state, "security_layer", None)
    if layer is not None and layer.audit is not None:
        action, _, target = change.partition(":")
        details = {"policy_version": policy.version}
        layer.audit.admin_change(get_principal(request.scope), action, target, details)
    return policy
