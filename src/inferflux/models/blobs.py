"""`BlobStore`: the GGUF files Ollama clients upload for `ollama create` (`/api/blobs`).

Owns: where a blob lives (`<models folder>/blobs/sha256-<hex>.gguf`, so manifest entries
name it by a path inside the models folder), writing an upload (a temporary file in the
same folder, hashed as it arrives, bounded by `registry.max_blob_bytes`, renamed into
place only when its SHA-256 is the digest the client named and it starts with the GGUF
magic) and removing a blob no model uses any more. Does not own the HTTP side
(api/ollama/blobs.py) or registering models (models/lifecycle.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import anyio

from inferflux.errors import InvalidRequest, RequestTooLarge

BLOBS_FOLDER = "blobs"
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
_GGUF_MAGIC = b"GGUF"
_WRITE_BYTES = 1 << 20  # buffered before each write (off the event loop)


def digest_hex(digest: str) -> str:
    """The hex of an Ollama digest (`sha256:<64 hex>`; `sha256-` also). Raises
    InvalidRequest."""
    match = _DIGEST.fullmatch(digest)
    if match is None:
        raise InvalidRequest(
            f"invalid digest {digest[:80]!r}: expected sha256:<64 lowercase hex digits>",
            param="digest",
        )
    return match.group(1)


class BlobStore:
    """Uploaded GGUF blobs under `models_dir`/blobs."""

    def __init__(self, models_dir: Path, max_bytes: int) -> None:
        self.folder = models_dir / BLOBS_FOLDER
        self.max_bytes = max_bytes

    def relative_path(self, sha256: str) -> str:
        """The blob's path inside the models folder (what a manifest entry names)."""
        return f"{BLOBS_FOLDER}/sha256-{sha256}.gguf"

    def path(self, sha256: str) -> Path:
        return self.folder / f"sha256-{sha256}.gguf"

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    async def write(self, sha256: str, chunks: AsyncIterator[bytes]) -> None:
        """Store the upload `chunks` as the blob `sha256`. Raises RequestTooLarge past
        `max_bytes` and InvalidRequest when the bytes are not a GGUF or do not hash to
        `sha256`; nothing is kept then."""
        await anyio.to_thread.run_sync(lambda: self.folder.mkdir(parents=True, exist_ok=True))
        handle, name = tempfile.mkstemp(prefix=".upload-", suffix=".part", dir=self.folder)
        temporary = Path(name)
        try:
            with os.fdopen(handle, "wb") as file:
                digest, size = await self._copy(chunks, file)
            _check(digest, size, sha256, temporary)
            await anyio.to_thread.run_sync(os.replace, temporary, self.path(sha256))
        finally:
            temporary.unlink(missing_ok=True)

    async def _copy(self, chunks: AsyncIterator[bytes], file: BinaryIO) -> tuple[str, int]:
        """Write `chunks` to `file` in 1 MiB writes on a worker thread; the SHA-256 and
        size written."""
        digest, size, pending = hashlib.sha256(), 0, bytearray()
        write = file.write
        async for chunk in chunks:
            size += len(chunk)
            if size > self.max_bytes:
                raise RequestTooLarge(
                    f"the blob is larger than the server's limit of {self.max_bytes} bytes "
                    "(registry.max_blob_bytes)"
                )
            digest.update(chunk)
            pending += chunk
            if len(pending) >= _WRITE_BYTES:
                await anyio.to_thread.run_sync(write, bytes(pending))
                pending.clear()
        await anyio.to_thread.run_sync(write, bytes(pending))
        return digest.hexdigest(), size

    def remove(self, relative_path: str) -> bool:
        """Delete the blob at `relative_path` (a path `relative_path` gave); False when
        it names no blob of this store."""
        name = relative_path.removeprefix(f"{BLOBS_FOLDER}/")
        if name == relative_path or _DIGEST.fullmatch(name.removesuffix(".gguf")) is None:
            return False
        self.path(digest_hex(name.removesuffix(".gguf"))).unlink(missing_ok=True)
        return True


def _check(digest: str, size: int, expected: str, temporary: Path) -> None:
    if digest != expected:
        raise InvalidRequest(
            f"digest mismatch: the body hashes to sha256:{digest}, not sha256:{expected}",
            param="digest",
        )
    with temporary.open("rb") as file:
        magic = file.read(len(_GGUF_MAGIC))
    if size < len(_GGUF_MAGIC) or magic != _GGUF_MAGIC:
        raise InvalidRequest(
            "the blob is not a GGUF file (InferFlux serves GGUF models only)", param="body"
        )
