"""List settings given as one environment variable."""

from __future__ import annotations

import json


def split_env_list(value: object, name: str) -> object:
    """A list setting from the environment arrives as one string: a JSON list
    (`["a", "b"]`) or comma-separated items (`a, b`). Any other value passes through (the
    field's own validation follows)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"{name} must be a JSON list or comma-separated items") from None
    return [part.strip() for part in text.split(",") if part.strip()]
