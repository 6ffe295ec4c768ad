"""Builds `Settings` from three layers: YAML file < `INFERFLUX_*` env vars < CLI flags.

This is the only module that reads config files or `os.environ` (besides `cli/` for
`INFERCTL_*`). Env vars name nested keys with `__` (`INFERFLUX_SERVER__PORT=9000`); the
names the spec uses are aliases (`INFERFLUX_MODEL_PATH`). Every validation error names
the key, the value, where it came from, and the fix.

Why not pydantic-settings' own sources: merging the layers here keeps track of which
layer set each key, so an error can say "env INFERFLUX_SERVER__PORT" instead of a bare
field path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from inferflux.config.settings import Settings
from inferflux.errors import ConfigError

ENV_PREFIX = "INFERFLUX_"

# Spec-named env vars → dotted keys.
ENV_ALIASES: dict[str, str] = {
    "INFERFLUX_MODEL_PATH": "model.path",
    "INFERFLUX_MODEL_ID": "model.id",
    "INFERFLUX_HOST": "server.host",
    "INFERFLUX_PORT": "server.port",
    "INFERFLUX_OLLAMA_PORT": "server.ollama_port",
    "INFERFLUX_GRPC_PORT": "server.grpc_port",
    "INFERFLUX_WORKERS": "runtime.workers",
    "INFERFLUX_LOG_LEVEL": "observability.log_level",
    "INFERFLUX_LOG_FORMAT": "observability.log_format",
    "INFERFLUX_REDIS_URL": "redis.url",
    "INFERFLUX_AUDIT_HMAC_KEY": "audit.hmac_key",
    "INFERFLUX_TLS_ENABLED": "server.tls.enabled",
    "INFERFLUX_TLS_CERT_PATH": "server.tls.cert_path",
    "INFERFLUX_TLS_KEY_PATH": "server.tls.key_path",
    "INFERFLUX_AUTH_PEPPER": "auth.pepper",
    "INFERFLUX_POLICY_STORE": "auth.policy_store",
    "INFERFLUX_POLICY_PASSPHRASE": "auth.policy_passphrase",
    "INFERFLUX_NVME_OFFLOAD_PATH": "runtime.nvme_offload.path",
    "INFERFLUX_KV_CPU_PAGES": "runtime.paged_kv.cpu_pages",
    "INFERFLUX_KV_EVICTION": "runtime.paged_kv.eviction",
    "INFERFLUX_SPECULATIVE_ENABLED": "runtime.speculative_decoding.enabled",
    "INFERFLUX_SPEC_DRAFT_MODEL": "runtime.speculative_decoding.draft_model",
    "INFERFLUX_SPEC_MAX_PREFILL": "runtime.speculative_decoding.max_prefill",
    "INFERFLUX_SPEC_CHUNK_SIZE": "runtime.speculative_decoding.max_draft_tokens",
    "INFERFLUX_FAULT_GPU_INIT": "runtime.fault_gpu_init",  # fault injection (reliability.md)
}
# Keys whose values are secrets: never quoted in an error message, and (ENV_ONLY) refused
# anywhere but the environment.
SECRET_KEYS = (
    "auth.api_keys",
    "auth.pepper",
    "auth.policy_passphrase",
    "redis.url",
    "audit.hmac_key",
    "router.stats_api_key",
    "router.redis_url",
)
ENV_ONLY_KEYS = {"auth.policy_passphrase": "INFERFLUX_POLICY_PASSPHRASE"}


def load_settings(
    config_file: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge the layers and validate. Raises ConfigError naming key, value, source and fix.

    `overrides` maps dotted keys (`"server.port"`) to values, as CLI flags give them;
    None values are skipped (flag not given).
    """
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is not None:
        _merge(merged, sources, _read_yaml(Path(config_file)), f"file {config_file}")
    for key, (value, source) in _env_layer(os.environ if env is None else env).items():
        _put(merged, sources, key, value, source)
    for key, value in (overrides or {}).items():
        if value is not None:
            _put(merged, sources, key, value, "command line")
    _refuse_secrets_outside_env(merged, sources)
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None


def _refuse_secrets_outside_env(merged: dict[str, Any], sources: dict[str, str]) -> None:
    """A secret set (not null) anywhere but the environment stops the load."""
    for key, env_name in ENV_ONLY_KEYS.items():
        node: Any = merged
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        source = _source_of(key, sources)
        if node is not None and not source.startswith("env "):
            raise ConfigError(
                f"{key} ({source}): a secret is never read from a file or flag; "
                f"remove it there and export {env_name} instead"
            )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist: fix the --config path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not a list/scalar")
    return data


def _env_layer(env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Dotted key → (value, source). Deterministic whatever the order of `env`: the
    `__` names override the aliases, and `__` names are read in sorted order."""
    layer: dict[str, tuple[str, str]] = {}
    for name, key in ENV_ALIASES.items():
        if name in env:
            layer[key] = (env[name], f"env {name}")
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and "__" in name:
            key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            layer[key] = (env[name], f"env {name}")
    return layer


def _merge(target: dict[str, Any], sources: dict[str, str], data: dict[str, Any], src: str) -> None:
    for section, values in data.items():
        if values is None:  # `server:` with every key commented out: an empty section
            continue
        if isinstance(values, dict):
            for key, value in values.items():
                _put(target, sources, f"{section}.{key}", value, src)
        else:
            target[section] = values
            sources[str(section)] = src


def _put(  # Any: raw config values, validated by Settings afterwards
    target: dict[str, Any], sources: dict[str, str], dotted: str, value: Any, source: str
) -> None:
    *parents, leaf = dotted.split(".")
    node = target
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"{dotted} ({source}): {part} must be a section (a mapping), not {child!r}"
            )
        node = child
    node[leaf] = value
    sources[dotted] = source


def _source_of(key: str, sources: dict[str, str]) -> str:
    """Where `key` was set; for a section (an unknown one, say), where its first key was."""
    if key in sources:
        return sources[key]
    inner = sorted(k for k in sources if k.startswith(f"{key}."))
    return sources[inner[0]] if inner else "default"


def _describe(exc: ValidationError, sources: dict[str, str]) -> str:
    lines = ["invalid configuration:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        source = _source_of(key, sources)
        if err["type"] == "extra_forbidden":
            lines.append(
                f"  {key} ({source}): unknown key; remove it or check the spelling "
                "(docs/configuration.md lists every key)"
            )
            continue
        shown = "<redacted>" if _is_secret(key) else repr(err.get("input"))
        lines.append(f"  {key} = {shown} ({source}): {err['msg']}; set a valid {key}")
    return "\n".join(lines)


def _is_secret(key: str) -> bool:
    """True for a secret key, a section holding one (`auth`), or a part of one."""
    return any(key == s or key.startswith(f"{s}.") or s.startswith(f"{key}.") for s in SECRET_KEYS)
