"""/v1/admin/config: the server's settings, read and changed at runtime (live tuning).

GET shows the effective settings (secrets masked) and which keys PATCH may change. PATCH
takes a partial body nested like the config file; `api/live_config.py` validates it with
the config schema and applies it (with `redis.url` set, through `api/config_sync.py`, which
publishes it to every replica first: 503 while Redis is unreachable). A key that needs a
restart is a 409
`restart_required`, an unknown key or a bad value a 400, and nothing changes then. Each
applied change is logged and audited with its actor.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import RootModel

from inferflux.api.admin.changes import record_change
from inferflux.api.deps import json_body
from inferflux.api.state import StateDep

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class ConfigPatch(RootModel[dict[str, Any]]):
    """A partial settings document, e.g. `{"scheduler": {"stream_interval": 4}}`."""


ConfigPatchBody = Annotated[ConfigPatch, Depends(json_body(ConfigPatch))]


@router.get("/config")
async def get_config(state: StateDep) -> dict[str, Any]:
    """The effective settings (secrets masked) and the dotted keys PATCH may change."""
    return state.live_config.view()


@router.patch("/config")
async def patch_config(request: Request, body: ConfigPatchBody, state: StateDep) -> dict[str, Any]:
    """Change live settings without a restart: the answer is GET's plus `changed`."""
    patcher = state.config_sync or state.live_config  # replicated when redis.url is set
    changed = await patcher.patch(body.root)
    if changed:
        record_change(request, f"config.update:{','.join(changed)}", {"values": changed})
    return {**state.live_config.view(), "changed": sorted(changed)}
