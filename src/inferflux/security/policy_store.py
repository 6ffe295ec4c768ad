"""`PolicyStore`: the policy (keys as digests, scopes, tenants, limits, tiers, guardrail
settings) in one AES-256-GCM encrypted file.

File layout (version 1); the whole 48-byte header is the AEAD's associated data, so no
byte of it can change without the tag failing:

    offset  size  field
    0       16    magic b"INFERFLUX-POLICY"
    16      1     format version (1)
    17      3     scrypt log2(N), r, p
    20      16    scrypt salt (random per store)
    36      12    AES-GCM nonce (random per write)
    48      ...   ciphertext of the JSON document, then the 16-byte GCM tag

The key is scrypt(INFERFLUX_POLICY_PASSPHRASE, salt); derived once per process and kept
for later writes (same salt, fresh nonce each time: random 96-bit nonces are safe far
beyond any number of admin changes). Writes are atomic: a temp file in the same folder
(mode 0600), fsync, rename over the store, fsync of the folder. A file that is truncated,
tampered with, made from another store's pieces, or sealed with another passphrase fails
the tag and refuses to load (`PolicyStoreError`); nothing ever falls back to an empty
(open) policy.

Rollback: a store replaced by an older, authentic copy (same passphrase) holds a lower
policy version than one written before. Every write records its version in the
witnesses (policy_witness.py: a MACed sidecar file, and Redis when configured); a load
whose version is below the highest recorded one refuses (`PolicyStoreError`) unless the
rollback is accepted (`auth.policy_accept_rollback`, for the one start that restores a
backup on purpose), which resets the witnesses to the loaded version. A witness that
cannot be read is logged and skipped: deleting the sidecar only weakens the check to the
other witness, it never blocks a start.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import struct
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from inferflux.errors import PolicyStoreError
from inferflux.security.policy import Policy
from inferflux.security.policy_witness import FileWitness, VersionWitness, WitnessError

logger = logging.getLogger(__name__)

MAGIC = b"INFERFLUX-POLICY"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">16sB3B16s12s")
HEADER_BYTES = _HEADER.size  # 48
_TAG_BYTES = 16
DEFAULT_LOG2_N = 17  # scrypt N = 2**17, r = 8, p = 1: 128 MiB, ~0.5 s once per process
_LOG2_N_RANGE = range(14, 21)  # what a header may ask for (bounds the memory a file costs)
_R, _P = 8, 1


class _Document(msgspec.Struct, kw_only=True):
    format: int
    written_at: float
    policy: Policy


class PolicyStore:
    """One encrypted policy file. `load` and `save` block (file I/O, scrypt): call them
    from a thread when on the event loop."""

    def __init__(
        self,
        path: str | Path,
        passphrase: str,
        log2_n: int = DEFAULT_LOG2_N,
        *,
        witnesses: Sequence[VersionWitness] | None = None,
        accept_rollback: bool = False,
    ):
        if log2_n not in _LOG2_N_RANGE:
            raise ValueError(f"log2_n must be in {_LOG2_N_RANGE}")
        self.path = Path(path)
        self._passphrase = passphrase.encode("utf-8")
        self._log2_n = log2_n
        self._salt: bytes | None = None
        self._key: bytes | None = None
        self._witnesses = [FileWitness(self.path)] if witnesses is None else list(witnesses)
        self._accept_rollback = accept_rollback

    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> Policy:
        """The stored policy. Raises PolicyStoreError naming what is wrong with the file."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise self._error(f"cannot be read ({exc.strerror})") from None
        _warn_if_readable_by_others(self.path)
        if len(data) < HEADER_BYTES + _TAG_BYTES:
            raise self._error("is truncated (shorter than its header)")
        magic, version, log2_n, r, p, salt, nonce = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise self._error("is not an InferFlux policy store (bad magic bytes)")
        if version != FORMAT_VERSION:
            raise self._error(f"has format version {version}; this InferFlux reads version 1")
        if log2_n not in _LOG2_N_RANGE or (r, p) != (_R, _P):
            raise self._error("has a damaged header (scrypt parameters out of range)")
        key = (
            self._key
            if salt == self._salt and self._key
            else _derive(self._passphrase, salt, log2_n)
        )
        try:
            plaintext = AESGCM(key).decrypt(nonce, data[HEADER_BYTES:], data[:HEADER_BYTES])
        except InvalidTag:
            raise self._error(
                "cannot be decrypted: the passphrase (INFERFLUX_POLICY_PASSPHRASE) is wrong, "
                "or the file was tampered with, truncated, or pieced from another store"
            ) from None
        try:
            document = msgspec.json.decode(plaintext, type=_Document)
        except msgspec.DecodeError as exc:
            raise self._error(f"decrypts but its content is invalid ({exc})") from None
        if document.format != FORMAT_VERSION:
            raise self._error(f"holds document format {document.format}; expected 1")
        self._salt, self._key, self._log2_n = salt, key, log2_n
        self._check_version(document.policy.version)
        return document.policy

    def save(self, policy: Policy) -> None:
        """Encrypt and atomically replace the file. Raises PolicyStoreError on I/O failure
        (the old file is then unchanged)."""
        if self._key is None or self._salt is None:
            self._salt = secrets.token_bytes(16)
            self._key = _derive(self._passphrase, self._salt, self._log2_n)
        nonce = secrets.token_bytes(12)
        header = _HEADER.pack(MAGIC, FORMAT_VERSION, self._log2_n, _R, _P, self._salt, nonce)
        document = _Document(format=FORMAT_VERSION, written_at=time.time(), policy=policy)
        sealed = AESGCM(self._key).encrypt(nonce, msgspec.json.encode(document), header)
        try:
            _write_atomically(self.path, header + sealed)
        except OSError as exc:
            raise self._error(f"cannot be written ({exc.strerror})") from None
        self._record(policy.version)

    def save_if_newer(self, policy: Policy) -> bool:
        """`save` unless the file already holds `policy.version` or a later one (policy
        replication: replicas that share one store file each write every version they
        apply, in any order). Holds an exclusive lock on `<store>.lock` while it reads
        and writes, so two processes never interleave. Raises PolicyStoreError."""
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self._error(f"lock {lock_path} cannot be opened ({exc.strerror})") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.exists() and self._file_version() >= policy.version:
                return False
            self.save(policy)
            return True
        finally:
            os.close(lock)  # releases the lock

    def _file_version(self) -> int:
        """The version the file holds now (decrypted; no rollback check)."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise self._error(f"cannot be read ({exc.strerror})") from None
        if len(data) < HEADER_BYTES + _TAG_BYTES:
            raise self._error("is truncated (shorter than its header)")
        _, _, log2_n, _, _, salt, nonce = _HEADER.unpack_from(data)
        if log2_n not in _LOG2_N_RANGE:
            raise self._error("has a damaged header (scrypt parameters out of range)")
        if salt != self._salt or self._key is None:
            key = _derive(self._passphrase, salt, log2_n)
            self._salt, self._key, self._log2_n = salt, key, log2_n
        try:
            plaintext = AESGCM(self._key).decrypt(nonce, data[HEADER_BYTES:], data[:HEADER_BYTES])
            return msgspec.json.decode(plaintext, type=_Document).policy.version
        except (InvalidTag, msgspec.DecodeError):
            raise self._error("cannot be decrypted or decoded (changed by someone else?)") from None

    def _check_version(self, version: int) -> None:
        """Refuse a rollback (module docstring); record `version` otherwise."""
        assert self._key is not None and self._salt is not None  # NOTE: after a decrypt
        highest, where = 0, ""
        for witness in self._witnesses:
            try:
                recorded = witness.highest(self._key, self._salt.hex())
            except WitnessError as exc:
                logger.warning("policy store rollback check skips a witness: %s", exc)
                continue
            if recorded is not None and recorded > highest:
                highest, where = recorded, witness.where
        rollback = version < highest
        if rollback and not self._accept_rollback:
            raise self._error(
                f"holds policy version {version}, but version {highest} was written before "
                f"(recorded in {where}): the file was replaced by an older copy, which "
                "would bring back revoked keys and old limits. If restoring it is intended, "
                "start once with INFERFLUX_AUTH__POLICY_ACCEPT_ROLLBACK=true "
                "(or --accept-policy-rollback)"
            )
        if rollback:
            logger.warning(
                "policy store %s: rollback from version %d to %d ACCEPTED "
                "(auth.policy_accept_rollback); the witnesses now record %d",
                self.path, highest, version, version,
            )  # fmt: skip
        self._record(version, reset=rollback)

    def _record(self, version: int, *, reset: bool = False) -> None:
        assert self._key is not None and self._salt is not None
        for witness in self._witnesses:
            try:
                witness.record(version, self._key, self._salt.hex(), reset=reset)
            except WitnessError as exc:
                logger.warning("policy version %d not recorded: %s", version, exc)

    def _error(self, problem: str) -> PolicyStoreError:
        return PolicyStoreError(f"policy store {self.path} {problem}")


def _derive(passphrase: bytes, salt: bytes, log2_n: int) -> bytes:
    return Scrypt(salt=salt, length=32, n=2**log2_n, r=_R, p=_P).derive(passphrase)


def _write_atomically(path: Path, data: bytes) -> None:
    """Temp file beside `path` (0600), fsync, rename over `path`, fsync the folder."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _warn_if_readable_by_others(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        logger.warning("policy store %s has mode %o: readable by others; chmod 600 it", path, mode)
