"""OIDC bearer tokens: JWT verification against the issuer's JWKS.

Owns: `JwksCache` (the issuer's signing keys, fetched over HTTPS from `jwks_url`, or from
the `jwks_uri` of the issuer's `/.well-known/openid-configuration` when `jwks_url` is not
set (OIDC Discovery; the document must name the same issuer); cached for
`jwks_max_age_s`, refetched when a token names an unknown `kid` at most once per
`jwks_refetch_cooldown_s`, and kept when a fetch fails) and `OidcVerifier` (one token →
its claims, or `TokenRejected`). Does not own: turning claims into a `Principal` (that is
`authn.py`, which knows the roles table and the policy).

What a token must pass, in order (each failure is a `TokenRejected`, never another error):
1. at most `max_token_bytes`, three base64url segments (PyJWT parses the header);
2. `alg` in the configured allow-list, which holds asymmetric algorithms only: `none`
   and HS* never verify, so a token "signed" with the public key as an HMAC secret fails;
3. `kid` names a key of the issuer's JWKS whose type fits `alg` (RSA for RS/PS, the
   right EC curve for ES). `jku`, `x5u`, `x5c` and an embedded `jwk` header are never
   read: keys come only from the configured JWKS URL;
4. the signature verifies; `iss` and `aud` equal the configured ones; `exp`, `nbf` (unless
   `require_nbf` is off), `iss`, `aud` and `sub` are present; `exp`/`nbf` hold within
   `leeway_s`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from inferflux.config.auth_settings import OidcSettings
from inferflux.observability.logging import redact_url, redact_urls

logger = logging.getLogger(__name__)

MAX_JWKS_BYTES = 1024 * 1024
DISCOVERY_PATH = "/.well-known/openid-configuration"
_EC_CURVES = {"ES256": "secp256r1", "ES384": "secp384r1", "ES512": "secp521r1"}


class TokenRejected(Exception):
    """The token does not verify. `reason` is a fixed phrase, never token content."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JwksCache:
    """The issuer's signing keys by `kid`. One fetch at a time (an asyncio lock).

    `clock` is `time.monotonic` except in tests. A failed fetch keeps the last good keys
    and is logged; no fetch is attempted within `jwks_refetch_cooldown_s` of the last one,
    so a flood of tokens with made-up `kid`s costs the issuer at most one request per
    cooldown.
    """

    def __init__(self, settings: OidcSettings, clock: Callable[[], float] = time.monotonic):
        if settings.jwks_url is None and settings.issuer is None:
            raise ValueError("OIDC needs auth.oidc.issuer")
        self._url = settings.jwks_url or discovery_url(settings.issuer or "")
        self._settings = settings
        self._clock = clock
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = -math.inf
        self._attempted_at = -math.inf
        self._lock = asyncio.Lock()

    async def key(self, kid: str) -> jwt.PyJWK | None:
        """The key named `kid`, refreshing a stale set or an unknown kid first."""
        if self._clock() - self._fetched_at > self._settings.jwks_max_age_s:
            await self._refresh()
        found = self._keys.get(kid)
        if found is None:
            await self._refresh()
            found = self._keys.get(kid)
        return found

    async def _refresh(self) -> None:
        async with self._lock:
            now = self._clock()
            if now - self._attempted_at < self._settings.jwks_refetch_cooldown_s:
                return
            self._attempted_at = now
            try:
                keys = await self._fetch()
            except (httpx.HTTPError, ValueError, ssl.SSLError, OSError) as exc:
                logger.warning(
                    "JWKS fetch from %s failed (%s: %s); keeping %d cached key(s)",
                    redact_url(self._url),
                    type(exc).__name__,
                    redact_urls(str(exc)),
                    len(self._keys),
                )
                return
            self._keys = keys
            self._fetched_at = now
            logger.info("JWKS from %s: %d signing key(s)", redact_url(self._url), len(keys))

    async def _fetch(self) -> dict[str, jwt.PyJWK]:
        verify: ssl.SSLContext | bool = True
        if self._settings.jwks_ca_file:
            verify = ssl.create_default_context(cafile=self._settings.jwks_ca_file)
        timeout = self._settings.jwks_timeout_s
        async with httpx.AsyncClient(verify=verify, timeout=timeout) as client:
            url = self._settings.jwks_url or await self._discover(client)
            document = await _get_json(client, url)
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise ValueError("the document has no `keys` list")
        keys = {kid: key for kid, key in map(_signing_key, entries) if key is not None}
        if not keys:
            raise ValueError("no usable signing key in the JWKS")
        return keys

    async def _discover(self, client: httpx.AsyncClient) -> str:
        """The `jwks_uri` of the issuer's discovery document (fetched on every refresh:
        an IdP that moves its keys is followed). Raises ValueError for a document that
        names another issuer or a `jwks_uri` the server may not fetch."""
        document = await _get_json(client, self._url)
        issuer = document.get("issuer") if isinstance(document, dict) else None
        if issuer != self._settings.issuer:
            raise ValueError("the discovery document names another issuer")
        jwks_uri = document.get("jwks_uri") if isinstance(document, dict) else None
        if not isinstance(jwks_uri, str):
            raise ValueError("the discovery document has no jwks_uri")
        self._settings.check_fetch_url(jwks_uri, "jwks_uri")
        return jwks_uri


def discovery_url(issuer: str) -> str:
    """`<issuer>/.well-known/openid-configuration` (OIDC Discovery 1.0, section 4)."""
    return issuer.rstrip("/") + DISCOVERY_PATH


async def _get_json(client: httpx.AsyncClient, url: str) -> object:
    response = await client.get(url, headers={"accept": "application/json"})
    if response.status_code != 200:
        raise ValueError(f"HTTP {response.status_code}")
    if len(response.content) > MAX_JWKS_BYTES:
        raise ValueError(f"the document is larger than {MAX_JWKS_BYTES} bytes")
    return response.json()


def _signing_key(entry: object) -> tuple[str, jwt.PyJWK | None]:
    """(kid, key) for a public signing key with a kid; (kid, None) for anything else."""
    if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
        return "", None
    kid = entry["kid"]
    if entry.get("use", "sig") != "sig" or "d" in entry:  # encryption or private keys
        return kid, None
    try:
        return kid, jwt.PyJWK(entry)
    except (jwt.PyJWTError, ValueError, TypeError, KeyError):
        logger.warning("JWKS key %r is not a usable signing key; skipped", kid[:64])
        return kid, None


def _fits(key: object, alg: str) -> bool:
    """True when the JWK's key type is the one `alg` needs."""
    if alg.startswith(("RS", "PS")):
        return isinstance(key, rsa.RSAPublicKey)
    if isinstance(key, ec.EllipticCurvePublicKey):
        return key.curve.name == _EC_CURVES.get(alg)
    return False


_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "expired"),
    (jwt.ImmatureSignatureError, "not yet valid"),
    (jwt.InvalidAudienceError, "wrong audience"),
    (jwt.InvalidIssuerError, "wrong issuer"),
    (jwt.MissingRequiredClaimError, "a required claim is missing"),
    (jwt.InvalidSignatureError, "bad signature"),
    (jwt.InvalidAlgorithmError, "unsupported algorithm"),
)


class OidcVerifier:
    """Verifies bearer JWTs for one issuer. Async-safe; holds the JWKS cache."""

    def __init__(self, settings: OidcSettings, jwks: JwksCache | None = None) -> None:
        self.settings = settings
        self._jwks = jwks or JwksCache(settings)
        required = ["exp", "iss", "aud", "sub"]
        self._required = [*required, "nbf"] if settings.require_nbf else required

    async def verify(self, token: str) -> dict[str, Any]:  # Any: JSON claim values
        """The token's claims. Raises TokenRejected with a fixed reason phrase."""
        if len(token) > self.settings.max_token_bytes:
            raise TokenRejected("token too large")
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, ValueError, TypeError):
            raise TokenRejected("malformed token") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.settings.algorithms:
            raise TokenRejected("unsupported algorithm")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid or len(kid) > 256:
            raise TokenRejected("no key id")
        jwk = await self._jwks.key(kid)
        if jwk is None:
            raise TokenRejected("unknown key id")
        if not _fits(jwk.key, alg):
            raise TokenRejected("key type does not match the algorithm")
        return self._decode(token, jwk, alg)

    def _decode(self, token: str, jwk: jwt.PyJWK, alg: str) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=jwk.key,
                algorithms=[alg],
                audience=self.settings.audience,
                issuer=self.settings.issuer,
                leeway=self.settings.leeway_s,
                options={"require": self._required, "verify_signature": True},
            )
        except jwt.PyJWTError as exc:
            reason = next((r for t, r in _REASONS if isinstance(exc, t)), "invalid token")
            raise TokenRejected(reason) from None
        except (ValueError, TypeError, KeyError, OverflowError):
            raise TokenRejected("malformed token") from None
        return claims
