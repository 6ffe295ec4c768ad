"""API keys: generation, digests, and the constant-time lookup behind authentication.

Owns: `generate_api_key` (`sk-inf-` + 32 random bytes, urlsafe base64, and a public key
id), `KeyDigester` (SHA-256, or HMAC-SHA-256 keyed with the server pepper), `ApiKeyIndex`
(digest → record, built once per policy snapshot) and `bearer_credentials` (where a
credential may come from). Does not own: the middleware (`authn.py`) or the policy.

Timing. A presented key is digested first (SHA-256 costs the same for every key of a
given length), then the digest is looked up in a dict. The dict's hash and string compare
run on the digest, not on the key: what a timing observer could learn is how many leading
bytes of SHA-256(guess) match a stored digest, and a matching digest prefix gives no
handle on a preimage (finding a key with a chosen digest prefix is exactly as hard as
guessing keys), so it leaks nothing usable. The candidate record is then confirmed with
`hmac.compare_digest` on the full digest, so the final accept/reject never short-circuits
on a secret. Keys are taken only from `Authorization: Bearer` or `x-api-key`, never from
the query string; a key never reaches a log line or an error message.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from inferflux.security.policy import ApiKeyRecord

KEY_PREFIX = "sk-inf-"
KEY_ID_PREFIX = "key_"
_SECRET_BYTES = 32
MAX_KEY_CHARS = 512
# Query parameters that clients (or libraries) use to carry credentials: a request that
# sends one gets 401 and the value is never used or logged.
CREDENTIAL_QUERY_PARAMS = frozenset(
    {"api_key", "api-key", "apikey", "key", "access_token", "token", "x-api-key"}
)


@dataclass(frozen=True, slots=True)
class NewApiKey:
    """A freshly generated key. `secret` is shown to the caller once and then dropped."""

    key_id: str
    secret: str


def generate_api_key() -> NewApiKey:
    """A new random key (256 bits from `secrets`) and its public id."""
    raw = base64.urlsafe_b64encode(secrets.token_bytes(_SECRET_BYTES)).rstrip(b"=")
    return NewApiKey(
        key_id=KEY_ID_PREFIX + secrets.token_hex(8), secret=KEY_PREFIX + raw.decode("ascii")
    )


class KeyDigester:
    """Digests keys: hex SHA-256, or hex HMAC-SHA-256 keyed with `pepper` when one is set.

    With a pepper, a stolen policy store (or config file) alone does not allow offline
    guessing of weak development keys: the pepper lives only in the server's environment.
    """

    def __init__(self, pepper: str | None = None) -> None:
        self._pepper = pepper.encode("utf-8") if pepper else None

    @property
    def peppered(self) -> bool:
        return self._pepper is not None

    def digest(self, key: str) -> str:
        data = key.encode("utf-8")
        if self._pepper is None:
            return hashlib.sha256(data).hexdigest()
        return hmac.new(self._pepper, data, hashlib.sha256).hexdigest()


def default_key_id(digest: str) -> str:
    """The id of a config key without one: derived from its digest (stable across runs).
    Twelve hex digits of a digest say nothing about the key (see the module docstring)."""
    return "cfg-" + digest[:12]


class ApiKeyIndex:
    """Digest → record for one policy snapshot. Immutable once built; safe to share."""

    def __init__(self, records: Iterable[ApiKeyRecord], digester: KeyDigester) -> None:
        self._digester = digester
        self._by_digest: dict[str, ApiKeyRecord] = {r.digest: r for r in records}

    def __len__(self) -> int:
        return len(self._by_digest)

    def lookup(self, key: str, now: float) -> ApiKeyRecord | None:
        """The live record for `key`, or None (unknown, revoked or expired alike)."""
        if not key or len(key) > MAX_KEY_CHARS:
            return None
        digest = self._digester.digest(key)
        record = self._by_digest.get(digest)
        if record is None or not hmac.compare_digest(record.digest, digest):
            return None
        if record.revoked or (record.expires_at is not None and record.expires_at <= now):
            return None
        return record


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a request presented. `conflict`: two different credentials (refused)."""

    bearer: str | None = None
    api_key: str | None = None
    conflict: bool = False


def bearer_credentials(headers: Iterable[tuple[bytes, bytes]]) -> Credentials:
    """The `Authorization: Bearer` token and the `x-api-key` value of raw ASGI headers.

    Sent twice (two Authorization headers, or both headers with different values) is a
    conflict: a proxy and a client disagreeing about who calls is refused, not guessed.
    """
    bearers: list[str] = []
    api_keys: list[str] = []
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            bearers.append(token.strip() if scheme.lower() == "bearer" else "")
        elif name == b"x-api-key":
            api_keys.append(value.decode("latin-1").strip())
    if len(bearers) > 1 or len(api_keys) > 1:
        return Credentials(conflict=True)
    bearer = bearers[0] if bearers else None
    api_key = api_keys[0] if api_keys else None
    if bearer is not None and api_key is not None and bearer != api_key:
        return Credentials(conflict=True)
    return Credentials(bearer=bearer, api_key=api_key)
