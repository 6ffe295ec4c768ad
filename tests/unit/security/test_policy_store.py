"""The encrypted policy store: round trip, atomic 0600 writes, and every way a file can be
wrong refuses to load (never an empty policy)."""

from __future__ import annotations

import json
import stat
from dataclasses import replace

import pytest

from inferflux.errors import PolicyStoreError
from inferflux.security.policy import (
    ApiKeyRecord,
    GuardrailPolicy,
    Policy,
    RateLimits,
    TenantPolicy,
)
from inferflux.security.policy_store import HEADER_BYTES, PolicyStore
from inferflux.security.principal import Scope

PASS = "correct horse battery staple"
FAST = 14  # scrypt N = 2**14: the production default (2**17) is tested once below


def sample_policy() -> Policy:
    return Policy(
        keys=(
            ApiKeyRecord(
                key_id="key_1",
                digest="ab" * 32,
                tenant="acme",
                scopes=frozenset({Scope.READ, Scope.GENERATE}),
                limits=RateLimits(requests_per_minute=60),
                priority_cap="normal",
                allowed_models=frozenset({"smol"}),
                name="ci",
                created_at=1.5,
                expires_at=99.0,
                revoked=True,
            ),
        ),
        tenants=(TenantPolicy("acme", RateLimits(tokens_per_minute=1000), frozenset({"m"})),),
        tiers=(("gold", RateLimits(1, 2, 3)),),
        default_limits=RateLimits(max_concurrent=4),
        guardrails=GuardrailPolicy(blocklist=("bad",), pii_action="redact"),
        version=7,
    )


def test_round_trip_with_mode_0600_and_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "policy.store"
    store = PolicyStore(path, PASS, log2_n=FAST)
    assert not store.exists()
    store.save(sample_policy())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["policy.store", "policy.store.version"]  # the store and its witness
    assert PolicyStore(path, PASS).load() == sample_policy()
    raw = path.read_bytes()
    assert raw.startswith(b"INFERFLUX-POLICY") and b"acme" not in raw and b"abab" not in raw


def test_saving_again_keeps_the_salt_and_changes_the_nonce(tmp_path):
    path = tmp_path / "p.store"
    store = PolicyStore(path, PASS, log2_n=FAST)
    store.save(Policy(version=1))
    first = path.read_bytes()
    store.save(Policy(version=2))
    second = path.read_bytes()
    assert first[20:36] == second[20:36] and first[36:48] != second[36:48]
    assert PolicyStore(path, PASS).load().version == 2


def test_the_default_kdf_cost_round_trips(tmp_path):
    store = PolicyStore(tmp_path / "p.store", PASS)
    store.save(sample_policy())
    assert store.path.read_bytes()[17] == 17  # log2(N) in the header
    assert PolicyStore(store.path, PASS).load() == sample_policy()


def _refused(path, match: str, passphrase: str = PASS) -> None:
    with pytest.raises(PolicyStoreError, match=match) as info:
        PolicyStore(path, passphrase).load()
    assert str(path) in info.value.message


@pytest.fixture
def stored(tmp_path):
    path = tmp_path / "p.store"
    PolicyStore(path, PASS, log2_n=FAST).save(sample_policy())
    return path


def test_wrong_passphrase_is_refused(stored):
    _refused(stored, "passphrase .* is wrong, or the file was tampered", "another passphrase")


@pytest.mark.parametrize("offset", [17 + 1, 20, 36, 47, HEADER_BYTES, HEADER_BYTES + 5, -1])
def test_any_flipped_byte_is_refused(stored, offset):
    data = bytearray(stored.read_bytes())
    data[offset] ^= 0x01
    stored.write_bytes(bytes(data))
    _refused(stored, "cannot be decrypted|damaged header")


def test_truncated_files_are_refused(stored):
    data = stored.read_bytes()
    stored.write_bytes(data[:-1])
    _refused(stored, "cannot be decrypted")
    stored.write_bytes(data[:30])
    _refused(stored, "truncated")
    stored.write_bytes(b"")
    _refused(stored, "truncated")


def test_pieces_of_another_store_are_refused(stored, tmp_path):
    other = tmp_path / "other.store"
    PolicyStore(other, PASS, log2_n=FAST).save(sample_policy())
    mine, theirs = stored.read_bytes(), other.read_bytes()
    stored.write_bytes(mine[:HEADER_BYTES] + theirs[HEADER_BYTES:])
    _refused(stored, "cannot be decrypted")
    stored.write_bytes(theirs[:HEADER_BYTES] + mine[HEADER_BYTES:])
    _refused(stored, "cannot be decrypted")


def test_foreign_files_and_versions_are_refused(stored, tmp_path):
    data = stored.read_bytes()
    stored.write_bytes(b"X" + data[1:])
    _refused(stored, "not an InferFlux policy store")
    stored.write_bytes(data[:16] + bytes([2]) + data[17:])
    _refused(stored, "format version 2")
    stored.write_bytes(data[:17] + bytes([30]) + data[18:])
    _refused(stored, "damaged header")
    _refused(tmp_path / "missing.store", "cannot be read")


def test_a_failed_write_leaves_the_old_file(stored, tmp_path, monkeypatch):
    before = stored.read_bytes()
    store = PolicyStore(stored, PASS, log2_n=FAST)
    store.load()

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("inferflux.security.policy_store.os.replace", fail)
    with pytest.raises(PolicyStoreError, match="cannot be written"):
        store.save(Policy(version=99))
    assert stored.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def _versions(store: PolicyStore, path, *versions: int) -> dict[int, bytes]:
    """Save the sample policy at each version; the file's bytes after each save."""
    files = {}
    for version in versions:
        store.save(replace(sample_policy(), version=version))
        files[version] = path.read_bytes()
    return files


def test_an_older_copy_of_the_store_is_refused_as_a_rollback(tmp_path):
    path = tmp_path / "policy.store"
    files = _versions(PolicyStore(path, PASS, log2_n=FAST), path, 1, 2, 3)
    path.write_bytes(files[2])  # a restored backup, or an attacker undoing a revocation
    with pytest.raises(PolicyStoreError, match="version 2, but version 3 was written") as caught:
        PolicyStore(path, PASS).load()
    assert "policy.store.version" in caught.value.message
    assert "INFERFLUX_AUTH__POLICY_ACCEPT_ROLLBACK" in caught.value.message
    path.write_bytes(files[3])
    assert PolicyStore(path, PASS).load().version == 3  # the newest copy still loads


def test_an_accepted_rollback_loads_once_and_resets_the_witness(tmp_path, caplog):
    path = tmp_path / "policy.store"
    files = _versions(PolicyStore(path, PASS, log2_n=FAST), path, 4, 5)
    path.write_bytes(files[4])
    assert PolicyStore(path, PASS, accept_rollback=True).load().version == 4
    assert "rollback from version 5 to 4 ACCEPTED" in caplog.text
    assert PolicyStore(path, PASS).load().version == 4  # no flag needed from now on


def test_a_missing_or_forged_witness_never_blocks_a_start(tmp_path, caplog):
    path = tmp_path / "policy.store"
    files = _versions(PolicyStore(path, PASS, log2_n=FAST), path, 1, 2)
    witness = path.with_name("policy.store.version")
    witness.unlink()
    assert PolicyStore(path, PASS).load().version == 2  # an upgrade: none recorded yet
    assert witness.exists()  # ... and recorded at this load
    forged = json.loads(witness.read_text())
    witness.write_text(json.dumps({**forged, "version": 1}))  # lowered without the key
    path.write_bytes(files[1])
    assert PolicyStore(path, PASS).load().version == 1  # the forged witness is skipped
    assert "does not verify" in caplog.text
