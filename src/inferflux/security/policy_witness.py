"""Rollback detection for the policy store: the highest policy version ever written, kept
outside the store file, so a store replaced by an older valid copy (same passphrase: a
restored backup, or an attacker undoing a key revocation) is noticed at load.

Owns the two witnesses `PolicyStore` consults: `FileWitness`, a sidecar file next to the
store (`<store>.version`, the version with an HMAC keyed by the store's key, so it cannot
be lowered without the passphrase), and `RedisWitness`, a counter in Redis (when
`redis.url` is set: outside the host, so replacing both files on one machine is caught
too). Each only ever rises, unless a start that accepts a rollback resets it. Does not own
the store file, nor the decision to refuse (policy_store.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Protocol

from redis import Redis
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

_MAC_LABEL = b"inferflux policy version witness v1"
# Raise the counter only; return the value before. ARGV[2] = "1": set it whatever it was.
_RAISE = """
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[2] == '1' or tonumber(ARGV[1]) > before then redis.call('SET', KEYS[1], ARGV[1]) end
return before
"""


class WitnessError(Exception):
    """A witness cannot be read (unreachable, or its content does not verify)."""


class VersionWitness(Protocol):
    """Somewhere the highest written policy version is kept. `store_key` is the store's
    encryption key (a file witness MACs with it); `store_id` names the store (its salt)."""

    @property
    def where(self) -> str: ...

    def highest(self, store_key: bytes, store_id: str) -> int | None:
        """The highest version recorded, None when nothing is. Raises WitnessError."""
        ...

    def record(self, version: int, store_key: bytes, store_id: str, *, reset: bool = False) -> None:
        """Raise the recorded version to `version` (set it, when `reset`). Raises
        WitnessError."""
        ...


def _mac(store_key: bytes, store_id: str, version: int) -> str:
    key = hmac.new(store_key, _MAC_LABEL, hashlib.sha256).digest()
    return hmac.new(key, f"{store_id}:{version}".encode(), hashlib.sha256).hexdigest()


class FileWitness:
    """`<store>.version`: {"store_id", "version", "mac"}, replaced atomically."""

    def __init__(self, store_path: Path) -> None:
        self.path = store_path.with_name(store_path.name + ".version")

    @property
    def where(self) -> str:
        return str(self.path)

    def highest(self, store_key: bytes, store_id: str) -> int | None:
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise WitnessError(f"{self.path} cannot be read ({exc})") from None
        version = document.get("version") if isinstance(document, dict) else None
        if not isinstance(version, int) or document.get("store_id") != store_id:
            raise WitnessError(f"{self.path} does not belong to this store")
        if not hmac.compare_digest(str(document.get("mac")), _mac(store_key, store_id, version)):
            raise WitnessError(f"{self.path} does not verify (edited, or another passphrase)")
        return version

    def record(self, version: int, store_key: bytes, store_id: str, *, reset: bool = False) -> None:
        if not reset:
            try:
                recorded = self.highest(store_key, store_id)
            except WitnessError:
                recorded = None
            if recorded is not None and recorded >= version:
                return
        document = {"store_id": store_id, "version": version}
        text = json.dumps({**document, "mac": _mac(store_key, store_id, version)})
        try:
            _replace(self.path, text.encode())
        except OSError as exc:
            raise WitnessError(f"{self.path} cannot be written ({exc.strerror})") from None


def _replace(path: Path, data: bytes) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class RedisWitness:
    """A counter at `<prefix>:policy-version:<store_id>` in Redis."""

    def __init__(self, url: str, *, prefix: str, timeout_s: float) -> None:
        self._client = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._prefix = prefix

    @property
    def where(self) -> str:
        return "Redis"

    def _key(self, store_id: str) -> str:
        return f"{self._prefix}:policy-version:{store_id}"

    def highest(self, store_key: bytes, store_id: str) -> int | None:
        try:
            value = self._client.get(self._key(store_id))
        except RedisError as exc:
            raise WitnessError(f"Redis cannot be read ({type(exc).__name__})") from None
        return None if value is None else int(value)

    def record(self, version: int, store_key: bytes, store_id: str, *, reset: bool = False) -> None:
        try:
            self._client.eval(_RAISE, 1, self._key(store_id), str(version), "1" if reset else "0")
        except RedisError as exc:
            raise WitnessError(f"Redis cannot be written ({type(exc).__name__})") from None

    def close(self) -> None:
        self._client.close()
