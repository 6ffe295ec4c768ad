"""Verifying a model file before llama.cpp reads a byte of it.

Owns: resolving a registry path inside the models folder (`resolve_in_folder`: a path
that escapes it, through `..` or a symlink, is refused), the streamed SHA-256 check
(`verified_file`: constant memory, 1 MiB at a time; `verify_mmproj` for a multimodal
projector, which also checks its header) and ed25519 signatures over a manifest entry
(`SignatureVerifier`).

Every process that hands a model file to llama.cpp verifies it first: the API process
before its vocab-only load, each worker before its full load (so a file replaced on disk
later is refused when a worker restarts). Hashing a path and then giving llama.cpp the
path would leave a window in which the file can be swapped; `verified_file` instead
yields `/proc/self/fd/<n>`, the very descriptor that was hashed, so llama.cpp reads
exactly the hashed bytes (its mmap outlives the descriptor). Without /proc (not Linux)
it falls back to the path. A file rewritten in place by someone who can write the models
folder is out of scope: they control what is served anyway.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import hashlib
import hmac
import logging
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from inferflux.engine.gguf_metadata import read_gguf_metadata
from inferflux.errors import (
    ConfigError,
    ModelFileNotFound,
    ModelLoadError,
    ModelVerificationFailed,
)

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20
# open() errors that mean "no such file here" (a 404), not "the server cannot read it"
_NOT_FOUND = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP})
# An mmproj's GGUF header (llama.cpp tools/mtmd/clip-impl.h): architecture and vision flag.
MMPROJ_ARCHITECTURE = "clip"
_HAS_VISION = "clip.has_vision_encoder"


def resolve_in_folder(folder: Path, path: str, *, param: str = "path") -> Path:
    """`path` (relative to `folder`, or absolute) with symlinks resolved, refused with
    ModelVerificationFailed unless it stays inside `folder`. `param` names the field the
    path came from (`path`, `mmproj`) in the error."""
    what = "model path" if param == "path" else param
    if "\x00" in path:
        raise ModelVerificationFailed(f"a {what} cannot contain a NUL byte", param=param)
    root = folder.expanduser().resolve()
    candidate = Path(path).expanduser()
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not resolved.is_relative_to(root):
        raise ModelVerificationFailed(
            f"{what} {path!r} resolves outside the models folder {root}: put the file "
            "inside it (registry.models_dir)",
            param=param,
        )
    return resolved


def _open(path: Path) -> BinaryIO:
    """Open a regular file for reading. NOTE: O_NONBLOCK so that a FIFO planted at the
    path cannot block the open; it is then refused as not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in _NOT_FOUND:
            raise ModelLoadError(
                f"model file {path} cannot be opened: {exc}", param="path"
            ) from None
        raise ModelFileNotFound(f"model file {path} does not exist", param="path") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ModelFileNotFound(f"model path {path} is not a regular file", param="path")
    return os.fdopen(fd, "rb")


def sha256_of(file: BinaryIO) -> str:
    """SHA-256 of an open file, read from the start in 1 MiB chunks (memory stays flat)."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK_BYTES)
    view = memoryview(buffer)
    offset = 0
    while True:
        n = os.preadv(file.fileno(), [buffer], offset)
        if n == 0:
            return digest.hexdigest()
        digest.update(view[:n])
        offset += n


def sha256_of_path(path: Path) -> str:
    """SHA-256 of the regular file at `path` (a FIFO or device is refused, never read).
    Raises ModelFileNotFound, ModelLoadError."""
    with _open(path) as file:
        return sha256_of(file)


@contextlib.contextmanager
def verified_file(path: str | Path, expected_sha256: str | None) -> Iterator[str]:
    """Open `path`, refuse it (ModelVerificationFailed) unless it hashes to
    `expected_sha256` (None: no check), and yield a path that names exactly the open,
    verified file (see the module doc) until the block exits. Blocking (about a second
    per GB): call it off the event loop."""
    path = Path(path)
    with _open(path) as file:
        if expected_sha256:
            _check_sha256(file, path, expected_sha256.lower())
        fd_path = f"/proc/self/fd/{file.fileno()}"
        yield fd_path if os.path.exists(fd_path) else str(path)


def _check_sha256(file: BinaryIO, path: Path, expected: str) -> None:
    started_at = time.monotonic()
    actual = sha256_of(file)
    size = os.fstat(file.fileno()).st_size
    if not hmac.compare_digest(actual, expected):
        raise ModelVerificationFailed(
            f"model file {path} ({size} bytes) does not match its SHA-256: expected "
            f"{expected}, the file hashes to {actual}; the file is truncated, modified or "
            "not the one registered",
            param="sha256",
        )
    logger.info("verified %s (%d bytes) in %.2fs", path.name, size, time.monotonic() - started_at)


@contextlib.contextmanager
def verify_mmproj(path: str | Path, expected_sha256: str | None) -> Iterator[str]:
    """`verified_file` for a multimodal projector: open `path`, refuse it unless it hashes
    to `expected_sha256` (None: no check) and its GGUF header is a vision projector
    (`general.architecture` clip with `clip.has_vision_encoder`), and yield a path naming
    exactly the open, verified file (give that to libmtmd) until the block exits. Every
    process calls it before libmtmd reads the file, like `verified_file` for the model.
    Blocking. Raises ModelFileNotFound (missing), ModelVerificationFailed (hash, not a
    projector), ModelLoadError (unreadable), each naming the mmproj."""
    with contextlib.ExitStack() as stack:
        try:
            load_path = stack.enter_context(verified_file(path, expected_sha256))
            _check_projector(load_path, Path(path))
        except ModelLoadError as exc:
            raise as_mmproj_error(exc) from None
        yield load_path


def _check_projector(load_path: str, path: Path) -> None:
    try:
        meta = read_gguf_metadata(load_path)
    except ModelLoadError:
        raise ModelVerificationFailed(
            f"mmproj file {path} is not a GGUF file: give the model's multimodal projector "
            "(mmproj-*.gguf)",
            param="mmproj",
        ) from None
    if meta.architecture != MMPROJ_ARCHITECTURE or meta.values.get(_HAS_VISION) is not True:
        raise ModelVerificationFailed(
            f"mmproj file {path} is not a vision projector GGUF (general.architecture "
            f"{meta.architecture!r}, {_HAS_VISION} {meta.values.get(_HAS_VISION)!r}; expected "
            f"{MMPROJ_ARCHITECTURE!r} and true): give the model's mmproj-*.gguf, not a model",
            param="mmproj",
        )


def as_mmproj_error(exc: ModelLoadError) -> ModelLoadError:
    """The same error, naming the mmproj (its message and field) instead of the model."""
    if exc.param == "mmproj":
        return exc
    message = exc.message.replace("model file", "mmproj file", 1)
    message = message.replace("model path", "mmproj path", 1)
    return type(exc)(message, param="mmproj_sha256" if exc.param == "sha256" else "mmproj")


@dataclass(frozen=True, slots=True)
class SignatureVerifier:
    """ed25519 signatures of manifest entries against the trusted `registry.public_keys`."""

    keys: tuple[Ed25519PublicKey, ...]
    require: bool

    @classmethod
    def from_settings(cls, public_keys: list[str], require: bool) -> SignatureVerifier:
        """Parse base64 raw 32-byte keys. Raises ConfigError naming the bad one."""
        keys = []
        for index, text in enumerate(public_keys):
            try:
                raw = base64.b64decode(text, validate=True)
                keys.append(Ed25519PublicKey.from_public_bytes(raw))
            except (binascii.Error, ValueError):
                raise ConfigError(
                    f"registry.public_keys[{index}] is not an ed25519 public key: give the "
                    "32 raw key bytes in base64 (docs/models.md shows how to export one)"
                ) from None
        return cls(tuple(keys), require)

    def verify(self, model_id: str, canonical: bytes, signature: str | None) -> None:
        """Raise ModelVerificationFailed unless `signature` (base64) signs `canonical` with
        a trusted key; an unsigned entry passes unless signatures are required."""
        if signature is None:
            if self.require:
                raise ModelVerificationFailed(
                    f"model {model_id!r} is not signed and registry.require_signatures is on",
                    param="signature",
                )
            return
        if not self.keys:
            raise ModelVerificationFailed(
                f"model {model_id!r} is signed but registry.public_keys is empty: add the "
                "signer's public key",
                param="signature",
            )
        try:
            raw = base64.b64decode(signature, validate=True)
        except binascii.Error:
            raise ModelVerificationFailed(
                f"the signature of model {model_id!r} is not valid base64", param="signature"
            ) from None
        for key in self.keys:
            try:
                key.verify(raw, canonical)
                return
            except InvalidSignature:
                continue
        raise ModelVerificationFailed(
            f"the signature of model {model_id!r} does not verify with any of the "
            f"{len(self.keys)} registry.public_keys (a modified entry, or another signer)",
            param="signature",
        )
