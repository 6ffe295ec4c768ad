"""`inferctl pull REPO[:FILE]`: a GGUF from the Hugging Face Hub into the models directory.

Owns picking the file (the only `*.gguf` of the repo when FILE is not given), the download
(`hf_hub_download`: resumable, with its own progress bar), the SHA-256 check against the
hub's LFS hash and the models manifest `DIR/models.yaml` (format in docs/cli.md). It does
not load or validate the model itself.

The hub is `HF_ENDPOINT` (default https://huggingface.co), read by huggingface_hub at import;
huggingface_hub is imported lazily so the other commands start fast.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from inferflux.cli.inferctl.client import EXIT_API_ERROR, EXIT_USAGE_ERROR, fail

MANIFEST_NAME = "models.yaml"
BLOCK_SIZE = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


class Pulled(NamedTuple):
    """Where the file landed, its hash, how it was checked, and the manifest written."""

    path: Path
    sha256: str
    verification: str
    manifest: Path


class RemoteFile(NamedTuple):
    """The hub's view of one file: the commit it resolves to and its LFS sha256 if any."""

    commit: str
    sha256: str | None


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
    """The SHA-256 of `path`, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(BLOCK_SIZE):
            digest.update(block)
    return digest.hexdigest()


def pick_gguf(repo: str, revision: str) -> str:
    """The repo's only *.gguf file; typer.Exit(2) listing them when there are several."""
    from huggingface_hub import HfApi

    files = sorted(
        f for f in HfApi().list_repo_files(repo, revision=revision) if f.endswith(".gguf")
    )
    if len(files) == 1:
        return files[0]
    if not files:
        raise fail(f"{repo}@{revision} has no .gguf file", EXIT_USAGE_ERROR)
    listing = "\n  ".join(f"{repo}:{name}" for name in files)
    raise fail(f"{repo} has several .gguf files; pick one:\n  {listing}", EXIT_USAGE_ERROR)


def remote_file(repo: str, filename: str, revision: str) -> RemoteFile:
    """HEAD on the file: its commit, and its sha256 when the ETag is an LFS hash."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    metadata = get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision))
    etag = (metadata.etag or "").lower()
    return RemoteFile(metadata.commit_hash or revision, etag if _SHA256.fullmatch(etag) else None)


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


def _download(spec: str, revision: str, dest: Path) -> tuple[Path, RemoteFile, str, str]:
    from huggingface_hub import hf_hub_download

    repo, filename = parse_spec(spec)
    filename = filename or pick_gguf(repo, revision)
    remote = remote_file(repo, filename, revision)
    path = hf_hub_download(repo, filename, revision=remote.commit, local_dir=dest / repo)
    return Path(path), remote, repo, filename


def pull(spec: str, revision: str, dest: Path) -> Pulled:
    """Downloads, verifies and records one GGUF; typer.Exit(1) on hub errors or a bad hash.

    Side effects: writes under `dest`; deletes the file again when its hash is wrong.
    """
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    # NOTE: malformed hub answers surface as ValueError/KeyError/TypeError inside
    # huggingface_hub; they are a server fault to report, never a traceback.
    hub_errors = (OSError, EntryNotFoundError, HfHubHTTPError, ValueError, KeyError, TypeError)
    try:
        path, remote, repo, filename = _download(spec, revision, dest)
    except hub_errors as exc:
        raise fail(f"cannot pull {spec}@{revision}: {exc}", EXIT_API_ERROR) from None
    sha256 = file_sha256(path)
    if remote.sha256 is not None and sha256 != remote.sha256:
        path.unlink()
        raise fail(
            f"sha256 mismatch for {repo}/{filename}: the hub says {remote.sha256}, the download "
            f"is {sha256}; the file was deleted (run the pull again)"
        )
    verification = "matches the hub" if remote.sha256 else "not checked: the hub gave no LFS hash"
    entry = {
        "id": Path(filename).stem,
        "path": str(path.resolve()),
        "sha256": sha256,
        "source": f"hf://{repo}/{filename}@{remote.commit}",
    }
    manifest = dest / MANIFEST_NAME
    update_manifest(manifest, entry)
    return Pulled(path.resolve(), sha256, verification, manifest)
