"""`ModelSpec`: one model the server may load, with its file resolved and its entry verified.

Owns: turning the `model` settings section (`spec_from_settings`) or a manifest entry
(`spec_from_entry`: path inside the models folder, ed25519 signature) into a `ModelSpec`,
and the per-model `Settings` a model's workers run with (`model_settings`). Does not own:
reading files (config/manifest.py), hashing them or loading them (model_files.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from inferflux.config.manifest import (
    AdapterEntry,
    ManifestEntry,
    ModelParameters,
    canonical_entry,
)
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import SignatureVerifier, resolve_in_folder
from inferflux.engine.protocol import LoraAdapter
from inferflux.models.materialize import entry_file, entry_mmproj

SpecSource = Literal["config", "manifest", "admin"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A registered model. `sha256` None: not checked (only the `model` section's file
    may go unchecked). `source` says who registered it: the watcher only touches
    `manifest` specs."""

    model_id: str
    path: Path
    sha256: str | None
    aliases: tuple[str, ...] = ()
    is_default: bool = False
    n_ctx: int | None = None
    workers: int | None = None
    n_batch: int | None = None
    threads: int | None = None
    chat_template: str | None = None
    source: SpecSource = "config"
    adapters: tuple[LoraAdapter, ...] = ()  # LoRA on top of the base weights
    base_id: str | None = None  # with adapters: the base model's id
    system: str | None = None  # Ollama: the system prompt when a request sends none
    parameters: ModelParameters | None = None  # Ollama: default options
    mmproj: Path | None = None  # multimodal projector GGUF (images in); None: text only
    mmproj_sha256: str | None = None  # None: not checked (the `model` section's may not be)

    def names(self) -> tuple[str, ...]:
        return (self.model_id, *self.aliases)


def spec_from_settings(settings: Settings, path: Path) -> ModelSpec:
    """The one model of the `model` section (today's `model.path`), at `path`."""
    model = settings.model
    return ModelSpec(
        model_id=model.id or path.name.removesuffix(".gguf"),
        path=path,
        sha256=model.sha256.lower() if model.sha256 else None,
        is_default=True,
        n_ctx=model.ctx_size,
        chat_template=model.chat_template,
        source="config",
        mmproj=Path(model.mmproj).expanduser().resolve() if model.mmproj else None,
        mmproj_sha256=model.mmproj_sha256.lower() if model.mmproj_sha256 else None,
    )


def spec_from_entry(
    entry: ManifestEntry,
    folder: Path,
    verifier: SignatureVerifier,
    source: SpecSource,
    *,
    fetch: bool = False,
) -> ModelSpec:
    """Check the entry's signature (over the entry as written, URL included) and resolve
    its file and mmproj inside `folder`: a URL's download, a `quantization`'s output
    (models/materialize.py; `fetch` True downloads and quantizes now, blocking). Raises
    ModelVerificationFailed (bad signature, path or mmproj escaping the folder),
    ModelLoadError."""
    verifier.verify(entry.id, canonical_entry(entry), entry.signature)
    local = entry_file(entry, folder, fetch=fetch)
    mmproj = entry_mmproj(entry, folder, fetch=fetch)
    return ModelSpec(
        model_id=entry.id,
        path=local.path,
        sha256=local.sha256.lower() if local.sha256 else None,
        aliases=entry.aliases,
        is_default=entry.default,
        n_ctx=entry.n_ctx,
        workers=entry.workers,
        n_batch=entry.n_batch,
        threads=entry.threads,
        chat_template=entry.chat_template,
        source=source,
        system=entry.system,
        parameters=entry.parameters,
        mmproj=mmproj.path if mmproj is not None else None,
        mmproj_sha256=mmproj.sha256.lower() if mmproj is not None and mmproj.sha256 else None,
    )


def entry_from_spec(
    spec: ModelSpec, folder: Path, sha256: str, mmproj_sha256: str | None = None
) -> ManifestEntry:
    """A manifest entry serving `spec`'s file with its settings (no aliases, not the
    default, unsigned): what an Ollama copy or `create --from` starts from. `sha256` is
    the file's (the spec's, or hashed by the caller when the spec has none), and
    `mmproj_sha256` the mmproj's likewise. Raises ValueError when a file lies outside
    `folder`."""
    fields: dict[str, object] = {
        "id": spec.model_id,
        "path": str(spec.path.resolve().relative_to(folder.resolve())),
        "sha256": sha256,
    }
    if spec.mmproj is not None:
        fields["mmproj"] = str(spec.mmproj.resolve().relative_to(folder.resolve()))
        fields["mmproj_sha256"] = mmproj_sha256 or spec.mmproj_sha256
    optional = {
        "n_ctx": spec.n_ctx,
        "workers": spec.workers,
        "n_batch": spec.n_batch,
        "threads": spec.threads,
        "chat_template": spec.chat_template,
        "system": spec.system,
        "parameters": spec.parameters,
    }
    fields.update({key: value for key, value in optional.items() if value is not None})
    return ManifestEntry.model_validate(fields)


def spec_from_adapter(
    entry: AdapterEntry, base: ModelSpec, folder: Path, verifier: SignatureVerifier
) -> ModelSpec:
    """The model `<base id>:<adapter id>`: the base's file and settings plus the adapter.
    Raises ModelVerificationFailed (bad signature, path escaping the folder)."""
    verifier.verify(entry.id, canonical_entry(entry), entry.signature)
    adapter = LoraAdapter(
        adapter_id=entry.id,
        path=str(resolve_in_folder(folder, entry.path)),
        sha256=entry.sha256.lower(),
        scale=entry.scale,
    )
    return dataclasses.replace(
        base,
        model_id=f"{base.model_id}:{entry.id}",
        aliases=(),
        is_default=False,
        source="admin",
        adapters=(*base.adapters, adapter),
        base_id=base.model_id,
    )


def model_settings(settings: Settings, spec: ModelSpec) -> Settings:
    """`settings` with the spec's per-model values in place (workers, threads, n_batch,
    n_ctx, chat template, path, id and mmproj). The server-wide values fill the gaps."""
    runtime = settings.runtime.model_copy(
        update={
            "workers": spec.workers or settings.runtime.workers,
            "n_threads": spec.threads or settings.runtime.n_threads,
        }
    )
    scheduler = settings.scheduler.model_copy(
        update={"max_batch_tokens": spec.n_batch or settings.scheduler.max_batch_tokens}
    )
    model = settings.model.model_copy(
        update={
            "path": str(spec.path),
            "id": spec.model_id,
            "ctx_size": spec.n_ctx or settings.model.ctx_size,
            "chat_template": spec.chat_template,
            "sha256": spec.sha256,
            "mmproj": str(spec.mmproj) if spec.mmproj is not None else None,
            "mmproj_sha256": spec.mmproj_sha256,
        }
    )
    return settings.model_copy(update={"runtime": runtime, "scheduler": scheduler, "model": model})
