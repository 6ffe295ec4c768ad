"""Live tuning: which settings change at runtime, and a partial change checked against the
one configuration schema (PATCH /v1/admin/config).

Owns: `LIVE_KEYS` (the dotted keys a running server applies without a restart),
`patch_settings` (a nested partial body like the config file → a new, fully validated
`Settings` and the keys that changed, or `RestartRequired` / `InvalidRequest`). Does not
own applying a change to the running parts, nor showing the settings
(`api/live_config.py`), nor the policy the admin API keeps in the policy store (keys,
tenants, limits, guardrails: `/v1/admin/...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from inferflux.config.settings import Settings
from inferflux.errors import InvalidRequest, RestartRequired

# Read by the engine workers (sent to them) or by the API process on every decision.
LIVE_KEYS: frozenset[str] = frozenset(
    {
        "scheduler.max_batch_tokens",  # at most the value the workers started with
        "scheduler.queue_timeout_s",
        "scheduler.aging_s",
        "scheduler.batch_window_ms",
        "scheduler.itl_target_ms",
        "scheduler.itl_target_ratio",
        "scheduler.burst_stall_ms",
        "scheduler.memory_low_mb",
        "scheduler.stream_interval",
        "scheduler.embed_tokens_per_step",
        "scheduler.high_watermark",
        "scheduler.low_watermark",
        "scheduler.routing",
        "scheduler.balance_abs_threshold",
        "scheduler.balance_rel_threshold",
        "scheduler.affinity_min_match_tokens",
        "scheduler.fairness.enable_preemption",
        "scheduler.fairness.high_priority_threshold",
        "scheduler.fairness.max_timeslice_tokens",
        # read by the API process per request (disaggregated mode)
        "scheduler.disaggregated.ticket_wait_s",
        "scheduler.disaggregated.channel_capacity",
        "scheduler.disaggregated.min_prompt_tokens",
        "observability.log_level",
        "observability.log_sample_rate",
        "observability.tenant_logging",
    }
)
# Mappings of named entries that a change merges into (an entry set to null is removed).
_ENTRY_MAPS = frozenset({"observability.tenant_logging"})
# Where the admin API changes these instead (they live in the policy store).
_ELSEWHERE = {
    "auth.api_keys": "/v1/admin/api_keys",
    "auth.tenants": "/v1/admin/tenants",
    "rate_limit.default": "/v1/admin/rate_limit",
    "rate_limit.tiers": "/v1/admin/rate_limit",
    "guardrails": "/v1/admin/guardrails",
}
MAX_PATCH_KEYS = 256


@dataclass(frozen=True, slots=True)
class Patched:
    """The settings after a change, and the dotted keys whose values changed."""

    settings: Settings
    changed: tuple[str, ...]


def patch_settings(current: Settings, patch: Mapping[str, Any], *, batch_limit: int) -> Patched:
    """`current` with `patch` (nested like the config file) applied, validated as a whole by
    the config schema. A key outside `LIVE_KEYS` whose value differs is `RestartRequired`;
    a value the schema refuses, an unknown key or a non-object is `InvalidRequest`.
    `scheduler.max_batch_tokens` may not exceed `batch_limit`, its value at start (the
    workers' llama.cpp batch is sized then)."""
    merged = current.model_dump(mode="python")
    _merge(merged, patch, "")
    try:
        updated = Settings.model_validate(merged)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise InvalidRequest(f"{where}: {error['msg']}", param=where) from None
    changed = _changed(current.model_dump(), updated.model_dump(), "")
    for key in changed:
        if key not in LIVE_KEYS:
            raise RestartRequired(_restart_message(key), param=key)
    if updated.scheduler.max_batch_tokens > batch_limit:
        raise RestartRequired(
            f"scheduler.max_batch_tokens above {batch_limit}, the batch size the workers' "
            "llama.cpp contexts were made with, needs a restart",
            param="scheduler.max_batch_tokens",
        )
    return Patched(updated, tuple(changed))


def _merge(into: dict[str, Any], patch: Mapping[str, Any], prefix: str) -> None:
    """Deep-merge `patch` into `into`; an unknown key is refused here, by name."""
    if len(patch) > MAX_PATCH_KEYS:
        raise InvalidRequest(f"at most {MAX_PATCH_KEYS} keys in one change")
    for name, value in patch.items():
        key = f"{prefix}{name}"
        if name not in into:
            raise InvalidRequest(f"unknown setting '{key}'", param=key)
        if key in _ENTRY_MAPS and isinstance(into[name], dict) and isinstance(value, Mapping):
            entries = into[name]  # name → entry: an entry given replaces, null removes
            for entry, item in value.items():
                if item is None:
                    entries.pop(entry, None)
                else:
                    entries[entry] = item
        elif key in _SECTIONS and isinstance(value, Mapping):
            _merge(into[name], value, f"{key}.")
        else:
            into[name] = value


def _section_paths(model: type[BaseModel], prefix: str = "") -> frozenset[str]:
    """The dotted paths of the nested settings sections (merged key by key)."""
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            paths |= {prefix + name, *_section_paths(kind, f"{prefix}{name}.")}
    return frozenset(paths)


_SECTIONS = _section_paths(Settings)


def _changed(before: Any, after: Any, prefix: str) -> list[str]:
    """The dotted keys of the settings (not of sections) whose values differ."""
    path = prefix.rstrip(".")
    if (path and path not in _SECTIONS) or not isinstance(before, dict):
        return [] if before == after else [path]
    keys = sorted(set(before) | set(after))
    return [
        k for name in keys for k in _changed(before.get(name), after.get(name), f"{prefix}{name}.")
    ]


def _restart_message(key: str) -> str:
    for prefix, route in _ELSEWHERE.items():
        if key == prefix or key.startswith(prefix + "."):
            return f"{key} is not changed here: use {route} (the policy store)"
    return f"{key} takes effect at startup only: change it in the config file and restart"
