"""API keys: generation, digests, constant-time lookup, where credentials come from."""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import replace

from inferflux.security.api_keys import (
    ApiKeyIndex,
    Credentials,
    KeyDigester,
    bearer_credentials,
    default_key_id,
    generate_api_key,
)
from inferflux.security.policy import ApiKeyRecord
from inferflux.security.principal import Scope


def test_generated_keys_are_random_prefixed_and_carry_a_public_id():
    keys = [generate_api_key() for _ in range(50)]
    for key in keys:
        assert re.fullmatch(r"sk-inf-[A-Za-z0-9_-]{43}", key.secret)
        assert re.fullmatch(r"key_[0-9a-f]{16}", key.key_id)
        assert key.key_id not in key.secret
    assert len({k.secret for k in keys}) == len({k.key_id for k in keys}) == 50


def test_digests_are_sha256_or_hmac_with_the_pepper():
    assert KeyDigester().digest("dev-key-123") == hashlib.sha256(b"dev-key-123").hexdigest()
    peppered = KeyDigester("pepper!").digest("dev-key-123")
    expected = hmac.new(b"pepper!", b"dev-key-123", hashlib.sha256).hexdigest()
    assert peppered == expected != KeyDigester().digest("dev-key-123")
    assert default_key_id(expected) == "cfg-" + expected[:12]


def _record(secret: str, digester: KeyDigester, **changes) -> ApiKeyRecord:
    record = ApiKeyRecord(
        key_id="key_1", digest=digester.digest(secret), tenant="t", scopes=frozenset({Scope.READ})
    )
    return replace(record, **changes)


def test_lookup_finds_live_keys_only():
    digester = KeyDigester("p")
    live = _record("secret-live", digester)
    revoked = _record("secret-revoked", digester, key_id="key_2", revoked=True)
    expired = _record("secret-expired", digester, key_id="key_3", expires_at=100.0)
    later = _record("secret-later", digester, key_id="key_4", expires_at=300.0)
    index = ApiKeyIndex([live, revoked, expired, later], digester)
    assert index.lookup("secret-live", now=200.0) is live
    assert index.lookup("secret-later", now=200.0) is later
    assert index.lookup("secret-revoked", now=200.0) is None
    assert index.lookup("secret-expired", now=200.0) is None
    assert index.lookup("secret-unknown", now=200.0) is None
    assert index.lookup("", now=200.0) is None
    assert index.lookup("x" * 10_000, now=200.0) is None
    # a digest presented as the key is not the key
    assert index.lookup(live.digest, now=200.0) is None


def test_a_digest_without_the_pepper_does_not_match():
    record = _record("secret", KeyDigester())
    assert ApiKeyIndex([record], KeyDigester("pepper")).lookup("secret", now=0.0) is None


def test_credentials_from_headers():
    assert bearer_credentials([(b"authorization", b"Bearer abc")]) == Credentials(bearer="abc")
    assert bearer_credentials([(b"authorization", b"bearer  abc ")]) == Credentials(bearer="abc")
    assert bearer_credentials([(b"x-api-key", b"abc")]) == Credentials(api_key="abc")
    # another scheme is no credential we accept: an empty bearer (401 later)
    assert bearer_credentials([(b"authorization", b"Basic dTpw")]) == Credentials(bearer="")
    same = [(b"authorization", b"Bearer abc"), (b"x-api-key", b"abc")]
    assert bearer_credentials(same) == Credentials(bearer="abc", api_key="abc")
    assert bearer_credentials([(b"authorization", b"Bearer a"), (b"x-api-key", b"b")]).conflict
    assert bearer_credentials([(b"x-api-key", b"a"), (b"x-api-key", b"a")]).conflict
    assert bearer_credentials([]) == Credentials()
