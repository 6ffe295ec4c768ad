"""Model files from URLs: the Hugging Face Hub (`hf://org/repo/file.gguf@rev`) and http(s).

Owns: parsing model URLs (`HubRef`, `parse_hf_url`), picking a repo's GGUF, asking the hub
for a file's commit, size and LFS SHA-256 (`resolve_hub_file`), and the one download loop
(`fetch`): streamed with httpx into a temporary file beside the target, hashed while it
arrives, checked against the expected SHA-256, then renamed into place, so a partial or
wrong file never has the final name. A file already there with the same source and hash
(its `.source.json` record) is not fetched again (`downloaded`). Progress goes to a callback
(`Progress`): the server logs it, `inferctl pull` draws a bar, Ollama's `/api/pull` streams it.

Layout in the models folder: `org/repo/<file>` for the hub (what `inferctl pull` always
wrote), `<stem>.<sha12>.gguf` for an http(s) URL. Does not own: loading or quantizing
(models/quantize.py), nor the manifest entries that name URLs (models/materialize.py).

The hub is `HF_ENDPOINT` (default https://huggingface.co), read by huggingface_hub at
import; its token (`HF_TOKEN`) is sent to the hub only. Blocking: run it on a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from inferflux.config.manifest import HF_URL_SCHEME, is_model_url
from inferflux.errors import (
    InvalidRequest,
    ModelFileNotFound,
    ModelLoadError,
    ModelVerificationFailed,
)

logger = logging.getLogger(__name__)

BLOCK_SIZE = 1 << 20
RECORD_SUFFIX = ".source.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LOG_EVERY_S = 5.0
_TIMEOUT = httpx.Timeout(30.0, read=120.0)

# completed bytes, total bytes (None when the server does not say)
Progress = Callable[[int, int | None], None]


@dataclass(frozen=True, slots=True)
class HubRef:
    """A file of a hub repo. `filename` None: the repo's only .gguf."""

    repo: str
    filename: str | None = None
    revision: str = "main"

    def url(self) -> str:
        return f"{HF_URL_SCHEME}{self.repo}/{self.filename or ''}@{self.revision}"


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """The hub's view of one file: the URL to GET, its commit, size, LFS sha256 if any."""

    ref: HubRef
    url: str
    commit: str
    size: int | None
    sha256: str | None


@dataclass(frozen=True, slots=True)
class Downloaded:
    """A verified local copy. `checked_by` says what the hash was compared with."""

    path: Path
    sha256: str
    source: str
    checked_by: str


def parse_hf_url(url: str) -> HubRef:
    """`hf://org/repo/path/file.gguf@rev` (`@rev` optional) → HubRef; ConfigError-free:
    raises InvalidRequest naming the expected form."""
    body, _, revision = url.removeprefix(HF_URL_SCHEME).partition("@")
    parts = body.split("/")
    if len(parts) < 3 or not parts[-1].endswith(".gguf"):
        raise InvalidRequest(f"{url!r}: expected hf://ORG/REPO/FILE.gguf[@REVISION]", param="path")
    return hub_ref("/".join(parts[:2]), "/".join(parts[2:]), revision or "main")


def hub_ref(repo: str, filename: str | None, revision: str = "main") -> HubRef:
    """A checked HubRef: `repo` is ORG/NAME, and no part of it or of `filename` is empty,
    `.` or `..` (the file lands at `folder/repo/filename`). Raises InvalidRequest."""
    parts = [*repo.split("/"), *(filename.split("/") if filename is not None else [])]
    bad = any(part in ("", ".", "..") or "\\" in part for part in parts)
    if repo.count("/") != 1 or bad or not revision:
        raise InvalidRequest(
            f"{repo}:{filename or ''}: expected ORG/REPO[:FILE.gguf] (no empty, . or .. parts)",
            param="model",
        )
    return HubRef(repo, filename, revision)


def file_sha256(path: Path) -> str:
    """The SHA-256 of `path`, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(BLOCK_SIZE):
            digest.update(block)
    return digest.hexdigest()


# -- the hub --------------------------------------------------------------------------------
@contextlib.contextmanager
def _hub_errors(what: str) -> Iterator[None]:
    """huggingface_hub's errors as InferfluxErrors: 404 for a missing repo/file/revision."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except (RepositoryNotFoundError, EntryNotFoundError, RevisionNotFoundError) as exc:
        raise ModelFileNotFound(f"cannot pull {what}: {_first_line(exc)}", param="model") from None
    # NOTE: malformed hub answers surface as ValueError/KeyError/TypeError inside
    # huggingface_hub; they are the hub's fault to report, never a traceback.
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot pull {what}: {_first_line(exc)}", param="model") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def pick_gguf(repo: str, revision: str, label: str | None = None) -> str:
    """The repo's only *.gguf file (with `label`, e.g. `Q4_K_M`, in its name, case
    ignored, when given). ModelFileNotFound when it has none, InvalidRequest listing them
    when it has several."""
    from huggingface_hub import HfApi

    with _hub_errors(f"{repo}@{revision}"):
        names = HfApi().list_repo_files(repo, revision=revision)
    files = sorted(name for name in names if name.endswith(".gguf"))
    if label is not None:
        files = [name for name in files if label.lower() in Path(name).name.lower()]
    if len(files) == 1:
        return files[0]
    if not files:
        which = f"no .gguf file with {label!r} in its name" if label else "no .gguf file"
        raise ModelFileNotFound(f"{repo}@{revision} has {which}", param="model")
    listing = "\n  ".join(f"{repo}:{name}" for name in files)
    raise InvalidRequest(f"{repo} has several .gguf files; pick one:\n  {listing}", param="model")


def resolve_hub_file(ref: HubRef, label: str | None = None) -> RemoteFile:
    """HEAD on the file (after picking it, see `pick_gguf`, when `ref.filename` is None):
    its commit, size and sha256 when the ETag is an LFS hash. Raises ModelFileNotFound,
    InvalidRequest (several files), ModelLoadError."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    filename = ref.filename or pick_gguf(ref.repo, ref.revision, label)
    ref = HubRef(ref.repo, filename, ref.revision)
    url = hf_hub_url(ref.repo, filename, revision=ref.revision)
    with _hub_errors(f"{ref.repo}/{filename}@{ref.revision}"):
        metadata = get_hf_file_metadata(url)
    etag = (metadata.etag or "").lower()
    return RemoteFile(
        ref=ref,
        url=hf_hub_url(ref.repo, filename, revision=metadata.commit_hash or ref.revision),
        commit=metadata.commit_hash or ref.revision,
        size=metadata.size,
        sha256=etag if _SHA256.fullmatch(etag) else None,
    )


def download_hub_file(
    remote: RemoteFile, folder: Path, sha256: str | None = None, progress: Progress | None = None
) -> Downloaded:
    """Download `remote` into `folder/org/repo/file`, checked against `sha256` (else the
    hub's LFS hash). Raises ModelVerificationFailed (hash), ModelLoadError (transfer)."""
    from huggingface_hub.utils._headers import build_hf_headers

    assert remote.ref.filename is not None  # NOTE: resolve_hub_file picked it
    expected = (sha256 or remote.sha256 or "").lower() or None
    checked_by = "the given sha256" if sha256 else "the hub's LFS hash" if expected else ""
    target = folder / remote.ref.repo / remote.ref.filename
    source = f"{HF_URL_SCHEME}{remote.ref.repo}/{remote.ref.filename}@{remote.commit}"
    record = read_record(target)
    if expected and record and record["sha256"] == expected and target.is_file():
        return Downloaded(target, expected, source, "a previous download")
    digest = fetch(remote.url, target, expected, progress, headers=build_hf_headers())
    write_record(target, digest, source)
    return Downloaded(target, digest, source, checked_by or "not checked: the hub gave no hash")


# -- any URL --------------------------------------------------------------------------------
def url_target(folder: Path, url: str, sha256: str) -> Path:
    """Where an http(s) URL's file lives: `folder/<stem>.<sha12>.gguf`."""
    name = Path(unquote(urlsplit(url).path)).name or "model.gguf"
    stem = name.removesuffix(".gguf")
    return folder / f"{stem}.{sha256[:12].lower()}.gguf"


def download_url(
    url: str, folder: Path, sha256: str, progress: Progress | None = None
) -> Downloaded:
    """Download an http(s) URL into `url_target`, checked against `sha256`."""
    target = url_target(folder, url, sha256)
    digest = fetch(url, target, sha256.lower(), progress)
    write_record(target, digest, url)
    return Downloaded(target, digest, url, "the given sha256")


def fetch(
    url: str,
    target: Path,
    sha256: str | None,
    progress: Progress | None = None,
    headers: dict[str, str] | None = None,
) -> str:
    """Stream `url` into `target` atomically; returns the file's sha256.

    Side effects: creates `target`'s folder; writes `partial_path(target)` and renames it over
    `target` once the hash matches `sha256` (when given); removes it on any failure.
    Raises ModelVerificationFailed (wrong hash), ModelLoadError (HTTP or disk error).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    try:
        digest = _stream(url, partial, progress, headers or {})
        if sha256 is not None and digest != sha256.lower():
            raise ModelVerificationFailed(
                f"sha256 mismatch for {_shown(url)}: expected {sha256.lower()}, the download "
                f"is {digest}; nothing was kept (check the sha256, or pull again)",
                param="sha256",
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return digest


def partial_path(target: Path) -> Path:
    """A temporary name beside `target`, unique per call (two threads or processes fetching
    the same file never share one): `NAME.part-<pid>-<random>`."""
    return target.with_name(f"{target.name}.part-{os.getpid()}-{secrets.token_hex(4)}")


def _stream(url: str, partial: Path, progress: Progress | None, headers: dict[str, str]) -> str:
    digest = hashlib.sha256()
    try:
        with (
            httpx.Client(follow_redirects=True, timeout=_TIMEOUT, headers=headers) as client,
            client.stream("GET", url) as response,
        ):
            if response.status_code == 404:
                raise ModelFileNotFound(f"{_shown(url)} does not exist (404)", param="path")
            response.raise_for_status()
            total = int(response.headers["Content-Length"]) if _has_length(response) else None
            report = _Reporter(_shown(url), total, progress)
            with partial.open("wb") as out:
                for block in response.iter_bytes(BLOCK_SIZE):
                    out.write(block)
                    digest.update(block)
                    report.add(len(block))
            report.done()
    except (httpx.HTTPError, OSError) as exc:
        raise ModelLoadError(f"cannot download {_shown(url)}: {exc}", param="path") from None
    return digest.hexdigest()


def _has_length(response: httpx.Response) -> bool:
    return str(response.headers.get("Content-Length", "")).isdigit()


def _shown(url: str) -> str:
    """The URL without its query (signed CDN URLs carry credentials there)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"


class _Reporter:
    """Calls `progress` per block and logs every few seconds."""

    def __init__(self, what: str, total: int | None, progress: Progress | None) -> None:
        self.what = what
        self.total = total
        self.progress = progress
        self.completed = 0
        self.logged_at = time.monotonic()

    def add(self, num_bytes: int) -> None:
        self.completed += num_bytes
        if self.progress is not None:
            self.progress(self.completed, self.total)
        if time.monotonic() - self.logged_at >= _LOG_EVERY_S:
            self.logged_at = time.monotonic()
            self._log()

    def done(self) -> None:
        self._log()

    def _log(self) -> None:
        total = f"/{self.total / 1e6:.1f}" if self.total else ""
        logger.info("downloading %s: %.1f%s MB", self.what, self.completed / 1e6, total)


# -- the record beside a download -------------------------------------------------------------
def write_record(
    target: Path, sha256: str, source: str, requested: str | None = None, **extra: str
) -> None:
    """Record (atomically) where `target` came from, as asked (`requested`, e.g. `@main`)
    and as resolved (`source`, e.g. the commit), its sha256 and `extra` facts."""
    record = target.with_name(target.name + RECORD_SUFFIX)
    partial = partial_path(record)
    data = {"sha256": sha256, "source": source, "requested": requested or source, **extra}
    partial.write_text(json.dumps(data))
    os.replace(partial, record)


def read_record(target: Path) -> dict[str, str] | None:
    """The `{sha256, source}` written beside a download or quantization, None if absent
    (or unreadable: then the file is made again)."""
    record = target.with_name(target.name + RECORD_SUFFIX)
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("sha256"), str):
        return None
    return {key: str(value) for key, value in data.items()}


def downloaded(url: str, folder: Path, sha256: str | None) -> Downloaded | None:
    """The local copy of `url` when a previous download left it (file and record agree
    with the URL and `sha256`), else None. No network; does not hash the file (the load
    verifies it)."""
    if url.startswith(HF_URL_SCHEME):
        ref = parse_hf_url(url)
        assert ref.filename is not None  # NOTE: parse_hf_url requires a file
        target = folder / ref.repo / ref.filename
    elif is_model_url(url) and sha256 is not None:
        target = url_target(folder, url, sha256)
    else:
        return None
    record = read_record(target)
    if record is None or not target.is_file():
        return None
    if url not in (record.get("requested"), record.get("source")):
        return None
    if sha256 is not None and record["sha256"] != sha256.lower():
        return None
    return Downloaded(target, record["sha256"], record.get("source", url), "a previous download")


def download(
    url: str, folder: Path, sha256: str | None, progress: Progress | None = None
) -> Downloaded:
    """`url` in `folder`: the previous download when there is one, else fetched now.
    Raises InvalidRequest (bad URL), ModelFileNotFound, ModelVerificationFailed,
    ModelLoadError."""
    found = downloaded(url, folder, sha256)
    if found is not None:
        return found
    logger.info("downloading %s into %s", _shown(url), folder)
    if url.startswith(HF_URL_SCHEME):
        result = download_hub_file(resolve_hub_file(parse_hf_url(url)), folder, sha256, progress)
        write_record(result.path, result.sha256, result.source, url)
        return result
    if sha256 is None:
        raise InvalidRequest(f"{url!r}: an http(s) model URL needs its sha256", param="sha256")
    return download_url(url, folder, sha256, progress)
