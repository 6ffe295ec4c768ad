"""`inferctl pull REPO[:FILE]`: a GGUF from the Hugging Face Hub into the models directory.

Owns: the command's argument form, its progress bar and exit codes, and the models
manifest `DIR/models.yaml` it writes (format in docs/cli.md). The download itself (picking
the only `*.gguf` when FILE is not given, the atomic streamed download, the SHA-256 check
against the hub's LFS hash) is the server's own code, models/download.py, so a model
pulled here and a `hf://` URL in a manifest land in the same place: `DIR/org/repo/file`.
It does not load or validate the model itself.

The hub is `HF_ENDPOINT` (default https://huggingface.co), read by huggingface_hub at import;
the server code is imported lazily so the other commands start fast.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from inferflux.cli.inferctl.client import EXIT_API_ERROR, EXIT_USAGE_ERROR, fail

MANIFEST_NAME = "models.yaml"


class Pulled(NamedTuple):
    """Where the file landed, its hash, how it was checked, and the manifest written."""

    path: Path
    sha256: str
    verification: str
    manifest: Path


def models_dir(dest: Path | None) -> Path:
    """`--dest`, else INFERFLUX_MODELS_DIR, else ~/.cache/inferflux/models."""
    if dest is not None:
        return dest
    env = os.environ.get("INFERFLUX_MODELS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "inferflux" / "models"


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`owner/name[:file]` → (repo, file or None); typer.Exit(2) when malformed."""
    repo, _, filename = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise fail(f"{spec!r}: expected REPO[:FILE] with REPO as owner/name", EXIT_USAGE_ERROR)
    return repo, filename or None


def file_sha256(path: Path) -> str:
    """The SHA-256 of `path` (`inferctl admin` hashes files with it): the server's own
    function, imported when needed so other commands start fast."""
    from inferflux.models.download import file_sha256 as sha256_of_file

    return sha256_of_file(path)


def update_manifest(manifest: Path, entry: dict[str, str]) -> None:
    """Appends `entry` to the YAML list in `manifest`, replacing one with the same id/path.
    A manifest in the mapping form (`models:` holding the list, docs/models.md) keeps it."""
    data: Any = yaml.safe_load(manifest.read_text()) if manifest.exists() else None
    entries: list[dict[str, Any]] = (data.get("models") if isinstance(data, dict) else data) or []
    kept = [e for e in entries if e.get("id") != entry["id"] and e.get("path") != entry["path"]]
    updated: Any = [*kept, entry]
    if isinstance(data, dict):
        updated = {**data, "models": updated}
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(yaml.safe_dump(updated, sort_keys=False))


@contextmanager
def progress_bar(what: str, quiet: bool) -> Iterator[Callable[[int, int | None], None]]:
    """A rich download bar on stderr (nothing when `quiet`); yields the progress callback."""
    if quiet:
        yield lambda _done, _total: None
        return
    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def pull(spec: str, revision: str, dest: Path, quiet: bool = False) -> Pulled:
    """Downloads, verifies and records one GGUF; typer.Exit(1) on hub errors or a bad hash,
    typer.Exit(2) for a malformed spec or a repo with several .gguf files.

    Side effects: writes under `dest`; a download whose hash is wrong is not kept.
    """
    from inferflux.errors import InvalidRequest, ModelLoadError
    from inferflux.models.download import download_hub_file, hub_ref, resolve_hub_file

    repo, filename = parse_spec(spec)
    try:
        remote = resolve_hub_file(hub_ref(repo, filename, revision))
        with progress_bar(f"{remote.ref.repo}/{remote.ref.filename}", quiet) as progress:
            got = download_hub_file(remote, dest, None, progress)
    except InvalidRequest as exc:
        raise fail(exc.message, EXIT_USAGE_ERROR) from None
    except ModelLoadError as exc:  # ModelVerificationFailed included: "sha256 mismatch …"
        raise fail(exc.message, EXIT_API_ERROR) from None
    verification = "matches the hub" if remote.sha256 else "not checked: the hub gave no LFS hash"
    entry = {
        "id": Path(got.path.name).stem,
        "path": str(got.path.resolve()),
        "sha256": got.sha256,
        "source": got.source,
    }
    manifest = dest / MANIFEST_NAME
    update_manifest(manifest, entry)
    return Pulled(got.path.resolve(), got.sha256, verification, manifest)
