"""`Catalog`: the models a server starts with, from the manifest or the `model` section.

Owns: reading `registry.path` into verified `ModelSpec`s (signatures and paths checked
at startup, so a bad manifest stops the server with a clear message), the models folder
that manifest and admin-API paths resolve in, and the one-entry catalog of a server
without a manifest (today's `model.path`). Does not own: loading models (models/hub.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from inferflux.config.manifest import Manifest, read_manifest
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import SignatureVerifier
from inferflux.errors import ConfigError, ModelLoadError
from inferflux.models.files import resolve_model_path
from inferflux.models.materialize import prepare_settings
from inferflux.models.spec import ModelSpec, spec_from_entry, spec_from_settings


@dataclass(frozen=True, slots=True)
class Catalog:
    """The default model, the others to register, and where new ones may come from."""

    default: ModelSpec
    models_dir: Path
    verifier: SignatureVerifier
    others: tuple[ModelSpec, ...] = ()
    manifest_path: Path | None = None  # watched when set
    manifest: Manifest | None = field(default=None, compare=False)


def single_model_catalog(
    settings: Settings, path: Path, model_id: str | None = None, aliases: tuple[str, ...] = ()
) -> Catalog:
    """No manifest: the `model` section's file is the one (default) model (`model_id`
    overrides its id); admin-API loads resolve in registry.models_dir, else that file's
    folder. Raises ConfigError for a bad registry.public_keys entry."""
    registry = settings.registry
    folder = Path(registry.models_dir).expanduser() if registry.models_dir else path.parent
    verifier = SignatureVerifier.from_settings(registry.public_keys, registry.require_signatures)
    default = spec_from_settings(settings, path)
    if model_id is not None:
        default = dataclasses.replace(default, model_id=model_id, aliases=aliases)
    return Catalog(default=default, models_dir=folder, verifier=verifier)


def manifest_catalog(settings: Settings) -> Catalog:
    """Read and check `registry.path`. Raises ConfigError (unreadable or invalid manifest,
    both `model.path` and `registry.path` set, bad public key) or ModelVerificationFailed
    (a bad signature or a path escaping the models folder), naming the entry."""
    registry = settings.registry
    if registry.path is None:
        raise ConfigError("registry.path is not set")
    if settings.model.path is not None:
        raise ConfigError(
            "both model.path and registry.path are set: list the model in the manifest "
            "and remove model.path (or --model), or remove registry.path"
        )
    if settings.model.mmproj is not None:
        raise ConfigError(
            "both model.mmproj and registry.path are set: give the manifest entry its "
            "`mmproj` (and mmproj_sha256) and remove model.mmproj (or --mmproj)"
        )
    manifest_path = Path(registry.path).expanduser().resolve()
    manifest = read_manifest(manifest_path)
    default_id = manifest.default_id()
    if default_id is None:
        raise ConfigError(f"model manifest {manifest_path} lists no models: add one")
    folder = Path(registry.models_dir).expanduser() if registry.models_dir else manifest_path.parent
    verifier = SignatureVerifier.from_settings(registry.public_keys, registry.require_signatures)
    specs = []
    for entry in manifest.models:
        try:
            specs.append(spec_from_entry(entry, folder, verifier, "manifest", fetch=True))
        except ModelLoadError as exc:
            raise type(exc)(f"model manifest {manifest_path}: {exc.message}") from None
    default = next(spec for spec in specs if spec.model_id == default_id)
    default = dataclasses.replace(default, is_default=True)
    return Catalog(
        default=default,
        models_dir=folder,
        verifier=verifier,
        others=tuple(spec for spec in specs if spec.model_id != default_id),
        manifest_path=manifest_path,
        manifest=manifest,
    )


def catalog_from_settings(settings: Settings) -> Catalog:
    """The catalog `inferflux serve` starts with: the manifest's when registry.path is set,
    else the one model of the `model` section. A URL is downloaded and a `quantization`
    made first (blocking, logged). Raises ConfigError, ModelLoadError."""
    if settings.registry.path is not None:
        return manifest_catalog(settings)
    settings = prepare_settings(settings, lambda _: resolve_model_path(settings))
    return single_model_catalog(settings, resolve_model_path(settings))
