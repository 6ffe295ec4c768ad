"""What a well-formed admin body may still not ask for: the checks that need the current
policy. Each refusal is a 422 (`Unprocessable`) naming
the field, and nothing changes.

- A key's `name` holds no control character (NUL, CR, LF, ...): names are shown in
  listings and logs, where a CR or LF could forge a line.
- A key's `tenant` exists (`default` always does; create others with
  POST /v1/admin/tenants), and its `rate_limit_tier` is a configured tier.
- `allowed_models` entries are model names: a model id or alias (`org/model` allowed),
  optionally `:<adapter>` or Ollama's `:latest`; never a `.` or `..` path segment.

Blocklist patterns RE2 cannot run are refused by the body itself (`GuardrailRules` in
config/policy_schema.py, the config file's declaration: a 422 through api/errors.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from inferflux.api.admin.protocol import CreateKeyBody
from inferflux.errors import Unprocessable
from inferflux.security.policy import Policy

DEFAULT_TENANT = "default"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MODEL = r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}"
_MODEL_NAME = re.compile(rf"{_MODEL}(?::{_MODEL})?")


def check_key(body: CreateKeyBody, policy: Policy) -> None:
    """Raise Unprocessable for a new key that names what cannot be used."""
    if _CONTROL.search(body.name):
        raise Unprocessable(
            "the key name holds a control character (NUL, CR, LF, ...)", param="name"
        )
    if body.tenant != DEFAULT_TENANT and all(t.tenant != body.tenant for t in policy.tenants):
        raise Unprocessable(
            f"no tenant '{body.tenant}': create it first (POST /v1/admin/tenants)",
            param="tenant",
        )
    tiers = sorted(name for name, _ in policy.tiers)
    if body.rate_limit_tier is not None and body.rate_limit_tier not in tiers:
        raise Unprocessable(
            f"no rate-limit tier '{body.rate_limit_tier}' (tiers: {tiers or 'none'}; "
            "PUT /v1/admin/rate_limit adds one)",
            param="rate_limit_tier",
        )
    check_models(body.allowed_models, "allowed_models")


def check_models(models: Iterable[str] | None, param: str) -> None:
    """Raise Unprocessable for an `allowed_models` entry that cannot be a model name."""
    for index, name in enumerate(models or ()):
        segments = name.replace(":", "/").split("/")
        if _MODEL_NAME.fullmatch(name) is None or {".", ".."} & set(segments):
            raise Unprocessable(
                f"{name!r} is not a model name (an id or alias, optionally ':<adapter>')",
                param=f"{param}[{index}]",
            )
