"""`LiveConfig`: the server's settings read and changed at runtime (GET/PATCH
/v1/admin/config).

Owns applying a checked change (`config/live.py` decides what may change and validates it
with the config schema) to the running parts: the app's `Settings` (read per request by
the API process and by models loaded later), every resident model's workers
(`reconfigure`: the scheduler's knobs, the step budget, the stream interval, their log
policy), and this process's log policy. Also owns the settings view, with every secret
masked. Changes last until the process ends; the config file keeps what should survive a
restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from inferflux.config.live import LIVE_KEYS, patch_settings
from inferflux.config.loader import SECRET_KEYS
from inferflux.config.settings import Settings
from inferflux.models.hub import ModelHub
from inferflux.observability.logging import redact_url, update_log_policy

# Masked: the loader's secret keys (an API key entry by its secret fields, so the list
# still shows ids and scopes), and the credentials of every URL.
_SECRETS = frozenset(
    {key for key in SECRET_KEYS if key != "auth.api_keys"}
    | {"auth.api_keys.key", "auth.api_keys.sha256"}
)
_URL_NAMES = ("url", "endpoint")
MASK = "***"


class LiveConfig:
    """One app's settings, changed in place (`patch`) under a lock, one change at a time."""

    def __init__(self, settings: Settings, models: ModelHub) -> None:
        self._settings = settings
        self._batch_limit = settings.scheduler.max_batch_tokens  # the contexts' batch
        self._models = models
        self._lock = asyncio.Lock()

    def view(self) -> dict[str, Any]:
        """GET /v1/admin/config: the effective settings and the keys PATCH may change."""
        return {
            "object": "config",
            "config": _masked(self._settings.model_dump(mode="json")),
            "live": sorted(LIVE_KEYS),
        }

    async def patch(self, change: Mapping[str, Any]) -> dict[str, Any]:
        """Apply `change` (nested like the config file). Returns each dotted key that
        changed with its new value; raises RestartRequired (409) or InvalidRequest (400)
        and changes nothing then."""
        async with self._lock:
            patched = patch_settings(self._settings, change, batch_limit=self._batch_limit)
            if patched.changed:
                new = patched.settings
                self._settings.scheduler = new.scheduler
                self._settings.observability = new.observability
                update_log_policy(new.observability)
                for resident in list(self._models.residency):
                    await resident.serving.engine.reconfigure(new.scheduler, new.observability)
            values = self._settings.model_dump(mode="json")
            return {key: _lookup(values, key) for key in patched.changed}

    def live_values(self) -> dict[str, Any]:
        """Every live key's effective value (dotted key → JSON value): what config
        replication publishes (api/config_sync.py)."""
        values = self._settings.model_dump(mode="json")
        return {key: _lookup(values, key) for key in sorted(LIVE_KEYS)}

    def preview(self, change: Mapping[str, Any]) -> dict[str, Any]:
        """`live_values()` as they would be after `change`, nothing applied. Raises what
        `patch` raises."""
        patched = patch_settings(self._settings, change, batch_limit=self._batch_limit)
        values = patched.settings.model_dump(mode="json")
        return {key: _lookup(values, key) for key in sorted(LIVE_KEYS)}


def _lookup(values: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        values = values[part]
    return values


def _masked(value: Any, path: str = "") -> Any:
    if isinstance(value, dict):
        return {key: _masked(item, f"{path}.{key}" if path else key) for key, item in value.items()}
    if isinstance(value, list):
        return [_masked(item, path) for item in value]
    if value is None:
        return None
    if path in _SECRETS:
        return MASK
    if isinstance(value, str) and path.endswith(_URL_NAMES):
        return redact_url(value)
    return value
