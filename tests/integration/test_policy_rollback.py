"""Policy store rollback detection end to end: `inferflux serve` refuses a store replaced
by an older copy (exit 2, a message saying how to accept it), and with Redis the rollback
is caught even when the sidecar witness was rolled back with the store."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from inferflux.errors import PolicyStoreError
from inferflux.security.policy import Policy
from inferflux.security.policy_store import PolicyStore
from inferflux.security.policy_witness import FileWitness, RedisWitness
from tests.integration.server_process import INFERFLUX

PASSPHRASE = "a rollback test passphrase"
FAST = 14  # scrypt cost for tests


def _write_versions(store: PolicyStore, *versions: int) -> dict[int, tuple[bytes, bytes]]:
    """Save each version; the store's and the sidecar's bytes after each save."""
    sidecar = store.path.with_name(store.path.name + ".version")
    copies = {}
    for version in versions:
        store.save(replace(Policy(), version=version))
        copies[version] = (
            store.path.read_bytes(),
            sidecar.read_bytes() if sidecar.exists() else b"",
        )
    return copies


def _serve(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "INFERFLUX_POLICY_STORE": str(store),
        "INFERFLUX_POLICY_PASSPHRASE": PASSPHRASE,
        "INFERFLUX_SERVER__PORT": "1",  # never reached when the store is refused
    }
    return subprocess.run(
        [INFERFLUX, "serve", "--model", "/nonexistent.gguf", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_serve_refuses_a_rolled_back_store_and_accepts_it_when_told(tmp_path: Path) -> None:
    store = tmp_path / "policy.store"
    copies = _write_versions(PolicyStore(store, PASSPHRASE, log2_n=FAST), 1, 2)
    store.write_bytes(copies[1][0])
    refused = _serve(store)
    assert refused.returncode == 2
    assert "holds policy version 1, but version 2 was written before" in refused.stderr
    assert "--accept-policy-rollback" in refused.stderr
    assert PASSPHRASE not in refused.stderr + refused.stdout
    accepted = _serve(store, "--accept-policy-rollback")
    # past the store: it now stops at the missing model instead, having reset the witness
    assert "policy" not in accepted.stderr.splitlines()[-1].lower()
    assert "ACCEPTED" in accepted.stderr
    assert PolicyStore(store, PASSPHRASE).load().version == 1


def test_redis_catches_a_rollback_of_the_store_and_its_sidecar(
    tmp_path: Path, redis_server
) -> None:
    store_path = tmp_path / "policy.store"
    redis = RedisWitness(redis_server.url, prefix="test-rollback", timeout_s=2.0)
    witnesses = [FileWitness(store_path), redis]
    try:
        store = PolicyStore(store_path, PASSPHRASE, log2_n=FAST, witnesses=witnesses)
        copies = _write_versions(store, 1, 2, 3)
        sidecar = store_path.with_name("policy.store.version")
        store_path.write_bytes(copies[1][0])
        sidecar.write_bytes(copies[1][1])  # both files restored from one old backup
        with pytest.raises(PolicyStoreError, match="version 3 was written before .*Redis"):
            PolicyStore(store_path, PASSPHRASE, witnesses=witnesses).load()
        reloaded = PolicyStore(store_path, PASSPHRASE, witnesses=witnesses, accept_rollback=True)
        assert reloaded.load().version == 1
        assert PolicyStore(store_path, PASSPHRASE, witnesses=witnesses).load().version == 1
    finally:
        redis.close()


def test_an_unreachable_redis_never_blocks_a_start(tmp_path: Path, caplog) -> None:
    store_path = tmp_path / "policy.store"
    dead = RedisWitness("redis://127.0.0.1:1/0", prefix="test-rollback", timeout_s=0.2)
    try:
        store = PolicyStore(store_path, PASSPHRASE, log2_n=FAST, witnesses=[dead])
        _write_versions(store, 1)
        assert PolicyStore(store_path, PASSPHRASE, witnesses=[dead]).load().version == 1
    finally:
        dead.close()
    assert "Redis cannot be" in caplog.text
