"""`SnapshotCodec`: a policy snapshot as the bytes that policy replication keeps in Redis.

Layout: `b"IFPR"`, a format byte (1), a mode byte, then
- mode 1 (sealed, with `auth.policy_passphrase` set): a 12-byte random nonce and the
  AES-256-GCM ciphertext of the policy's JSON (tag included). The associated data binds
  the header, the replication namespace and the version the snapshot is published
  under, so a snapshot cannot be replayed under another version or namespace. The key is
  scrypt(passphrase, salt derived from the namespace): every replica with the same
  passphrase derives the same key, whatever its own store's salt;
- mode 0 (plain, no passphrase): the JSON itself. The policy holds key digests, never
  plaintext keys, so nothing secret is exposed; but whoever can write to Redis can then
  change the policy (a warning at start says so; docs/security.md).

Does not own: where the bytes live (security/policy_sync.py), nor the store file's format
(security/policy_store.py).
"""

from __future__ import annotations

import hashlib
import secrets

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from inferflux.security.policy import Policy
from inferflux.security.replication import SnapshotError

__all__ = ["DEFAULT_LOG2_N", "SnapshotCodec", "SnapshotError"]

_MAGIC = b"IFPR"
_FORMAT = 1
_PLAIN, _SEALED = 0, 1
_HEADER_BYTES = len(_MAGIC) + 2
_NONCE_BYTES = 12
_SALT_LABEL = b"inferflux policy replication v1:"
DEFAULT_LOG2_N = 17  # as the store: 128 MiB, ~0.5 s, once per process


class SnapshotCodec:
    """Seals and opens snapshots of one replication namespace. `passphrase` None: plain."""

    def __init__(
        self, namespace: str, passphrase: str | None, *, log2_n: int = DEFAULT_LOG2_N
    ) -> None:
        self._namespace = namespace.encode()
        self._key = None if passphrase is None else _derive(passphrase, namespace, log2_n)

    @property
    def sealed(self) -> bool:
        """True when snapshots are encrypted and authenticated."""
        return self._key is not None

    def seal(self, policy: Policy) -> bytes:
        """The bytes of `policy`, published under `policy.version`."""
        document = msgspec.json.encode(policy)
        if self._key is None:
            return _MAGIC + bytes((_FORMAT, _PLAIN)) + document
        header = _MAGIC + bytes((_FORMAT, _SEALED))
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = AESGCM(self._key).encrypt(nonce, document, self._aad(header, policy.version))
        return header + nonce + sealed

    def open(self, blob: bytes, version: int) -> Policy:
        """The policy published as `version`. Raises SnapshotError when `blob` is not a
        snapshot of this namespace and passphrase, or holds another version."""
        header, body = blob[:_HEADER_BYTES], blob[_HEADER_BYTES:]
        if len(header) < _HEADER_BYTES or header[:4] != _MAGIC or header[4] != _FORMAT:
            raise SnapshotError("not a policy snapshot of this InferFlux version")
        mode = header[5]
        if mode != (_SEALED if self._key is not None else _PLAIN):
            raise SnapshotError(
                "sealed with a passphrase while this replica has none, or the reverse: "
                "give every replica the same INFERFLUX_POLICY_PASSPHRASE"
            )
        if self._key is not None:
            nonce, sealed = body[:_NONCE_BYTES], body[_NONCE_BYTES:]
            try:
                body = AESGCM(self._key).decrypt(nonce, sealed, self._aad(header, version))
            except InvalidTag:
                raise SnapshotError(
                    "does not decrypt: another passphrase or namespace, or tampered with"
                ) from None
        try:
            policy = msgspec.json.decode(body, type=Policy)
        except msgspec.DecodeError as exc:
            raise SnapshotError(f"content is invalid ({exc})") from None
        if policy.version != version:
            raise SnapshotError(f"holds version {policy.version}, published as {version}")
        return policy

    def _aad(self, header: bytes, version: int) -> bytes:
        return header + self._namespace + b"\x00" + str(version).encode()


def _derive(passphrase: str, namespace: str, log2_n: int) -> bytes:
    salt = hashlib.sha256(_SALT_LABEL + namespace.encode()).digest()[:16]
    return Scrypt(salt=salt, length=32, n=2**log2_n, r=8, p=1).derive(passphrase.encode())
