"""The `registry` settings section: the model manifest, the models folder, how many models
stay resident, how long a swapped-out model drains, and the keys that sign manifest
entries (docs/models.md). Part of `Settings` (settings.py)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferflux.config.env_lists import split_env_list
from inferflux.config.manifest import MODEL_NAME_PATTERN, check_hf_url


class RegistrySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    path: str | None = Field(
        None,
        description="YAML manifest of the models to serve (docs/models.md). Unset: the one "
        "model of the `model` section.",
    )
    models_dir: str | None = Field(
        None,
        description="Folder that manifest and admin-API model paths resolve in; a path "
        "escaping it is refused. Unset: the manifest's folder.",
    )
    poll_interval_ms: int = Field(
        2000,
        ge=0,
        le=3_600_000,
        description="How often the manifest file is checked for changes (an added entry "
        "loads, a removed one unloads, a changed one is swapped). 0 = never.",
    )
    max_resident_models: int = Field(
        2,
        ge=1,
        le=64,
        description="Models loaded at once; loading one more unloads the least recently "
        "used idle model (never the default).",
    )
    drain_timeout_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="How long a swapped-out or unloaded model keeps serving its in-flight "
        "requests before its workers are stopped anyway.",
    )
    public_keys: list[str] = Field(
        default_factory=list,
        description="Trusted ed25519 public keys (base64 of the 32 raw bytes). A manifest "
        "entry's `signature` must verify with one of them.",
    )
    max_blob_bytes: int = Field(
        64 * 1024**3,
        ge=1024,
        le=1024**4,
        description="Largest GGUF an Ollama client may upload (POST /api/blobs/<digest>, "
        "for `ollama create`); bodies there are bounded by this, not "
        "server.max_request_bytes.",
    )
    require_signatures: bool = Field(
        False, description="Refuse manifest and admin-API models that carry no signature."
    )
    pull_sources: dict[str, str] = Field(
        default_factory=dict,
        max_length=1024,
        description="Ollama `/api/pull` names → hf:// URLs (`smollm2: hf://org/repo/f.gguf@main`). "
        "Names of the form hf.co/org/repo[:FILE] need no entry.",
    )

    @field_validator("pull_sources")
    @classmethod
    def _check_pull_sources(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            if re.fullmatch(MODEL_NAME_PATTERN, name) is None:
                raise ValueError(f"pull_sources: the name {name!r} must match {MODEL_NAME_PATTERN}")
            check_hf_url(url, f"pull_sources[{name!r}] =")
        return value

    @field_validator("public_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        return split_env_list(value, "public_keys")
