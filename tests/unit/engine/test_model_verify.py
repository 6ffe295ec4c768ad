"""Model file verification: folder containment, streamed SHA-256, ed25519 entry signatures."""

from __future__ import annotations

import base64
import hashlib
import os
import tracemalloc

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from inferflux.config.manifest import ManifestEntry, canonical_entry
from inferflux.engine.model_verify import (
    SignatureVerifier,
    resolve_in_folder,
    sha256_of,
    verified_file,
)
from inferflux.errors import ConfigError, ModelLoadError, ModelVerificationFailed


@pytest.fixture
def folder(tmp_path):
    models = tmp_path / "models"
    (models / "sub").mkdir(parents=True)
    (models / "sub" / "a.gguf").write_bytes(b"GGUF" + b"x" * 100)
    (tmp_path / "outside.gguf").write_bytes(b"GGUF")
    return models


def test_paths_resolve_inside_the_folder(folder):
    assert resolve_in_folder(folder, "sub/a.gguf") == (folder / "sub" / "a.gguf").resolve()
    assert resolve_in_folder(folder, str(folder / "sub" / "a.gguf")).name == "a.gguf"
    assert resolve_in_folder(folder, "sub/../sub/a.gguf").name == "a.gguf"


@pytest.mark.parametrize("path", ["../outside.gguf", "sub/../../outside.gguf", "/etc/passwd"])
def test_paths_escaping_the_folder_are_refused(folder, path):
    with pytest.raises(ModelVerificationFailed, match="outside the models folder") as raised:
        resolve_in_folder(folder, path)
    assert raised.value.param == "path" and raised.value.http_status == 422


def test_a_symlink_pointing_outside_is_refused(folder):
    (folder / "link.gguf").symlink_to(folder.parent / "outside.gguf")
    with pytest.raises(ModelVerificationFailed, match="outside the models folder"):
        resolve_in_folder(folder, "link.gguf")
    (folder / "inside.gguf").symlink_to(folder / "sub" / "a.gguf")
    assert resolve_in_folder(folder, "inside.gguf").name == "a.gguf"


def test_verified_file_yields_the_open_descriptor(folder):
    path = folder / "sub" / "a.gguf"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with verified_file(path, digest.upper()) as load_path:
        assert load_path.startswith("/proc/self/fd/")
        # the descriptor keeps naming the hashed bytes even when the path is replaced
        path.rename(folder / "moved.gguf")
        path.write_bytes(b"EVIL")
        with open(load_path, "rb") as file:
            assert file.read(4) == b"GGUF"
    with verified_file(path, None) as load_path, open(load_path, "rb") as file:
        assert file.read() == b"EVIL"  # no hash given: opened, not checked


def test_a_mismatch_or_truncated_file_is_refused(folder):
    path = folder / "sub" / "a.gguf"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(path.read_bytes()[:50])  # truncated
    with pytest.raises(ModelVerificationFailed) as raised, verified_file(path, digest):
        pytest.fail("the block must not run")
    message = raised.value.message
    assert "does not match its SHA-256" in message and "50 bytes" in message
    assert digest in message and "truncated" in message and raised.value.param == "sha256"


def test_missing_files_and_non_regular_files(folder):
    with pytest.raises(ModelLoadError, match="does not exist"), verified_file(folder / "no", None):
        pass
    fifo = folder / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelLoadError, match="not a regular file"), verified_file(fifo, None):
        pass
    with pytest.raises(ModelLoadError, match="not a regular file"), verified_file(folder, None):
        pass


def test_hashing_streams_in_constant_memory(tmp_path):
    path = tmp_path / "big.bin"
    with open(path, "wb") as file:
        for i in range(64):
            file.write(bytes([i]) * (1 << 20))  # 64 MiB
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    tracemalloc.start()
    with open(path, "rb") as file:
        assert sha256_of(file) == expected
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4 << 20, peak  # the 1 MiB buffer, not the 64 MiB file


def _keypair():
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return private, base64.b64encode(raw).decode()


def _signed(private, **fields):
    entry = ManifestEntry.model_validate(fields)
    signature = base64.b64encode(private.sign(canonical_entry(entry))).decode()
    return ManifestEntry.model_validate({**fields, "signature": signature})


ENTRY = {"id": "m", "path": "m.gguf", "sha256": "ab" * 32}


def test_signatures_verify_against_any_trusted_key():
    private, public = _keypair()
    _, other = _keypair()
    verifier = SignatureVerifier.from_settings([other, public], require=True)
    entry = _signed(private, **ENTRY)
    verifier.verify(entry.id, canonical_entry(entry), entry.signature)


@pytest.mark.parametrize(
    ("keys", "require", "tamper", "expected"),
    [
        ("other", False, None, "does not verify with any of the 1"),
        ("signer", False, {"path": "evil.gguf"}, "does not verify"),
        ("signer", False, {"sha256": "cd" * 32}, "does not verify"),
        ("none", False, None, "registry.public_keys is empty"),
        ("signer", False, {"signature": "!!notbase64"}, "not valid base64"),
        ("signer", True, {"signature": None}, "not signed and registry.require_signatures"),
    ],
)
def test_bad_signatures_are_refused(keys, require, tamper, expected):
    private, public = _keypair()
    _, other = _keypair()
    trusted = {"signer": [public], "other": [other], "none": []}[keys]
    verifier = SignatureVerifier.from_settings(trusted, require=require)
    entry = _signed(private, **ENTRY)
    if tamper is not None:
        entry = ManifestEntry.model_validate({**entry.model_dump(exclude_unset=True), **tamper})
    with pytest.raises(ModelVerificationFailed, match=expected) as raised:
        verifier.verify(entry.id, canonical_entry(entry), entry.signature)
    assert raised.value.param == "signature"


def test_unsigned_entries_pass_unless_required():
    SignatureVerifier.from_settings([], require=False).verify("m", b"{}", None)


@pytest.mark.parametrize("key", ["not base64!", base64.b64encode(b"short").decode()])
def test_bad_public_keys_are_config_errors(key):
    with pytest.raises(ConfigError, match=r"registry.public_keys\[0\]"):
        SignatureVerifier.from_settings([key], require=False)


def test_odd_paths_are_client_errors(folder):
    with pytest.raises(ModelVerificationFailed, match="NUL byte"):
        resolve_in_folder(folder, "a\x00b.gguf")
    long_name = folder / ("x" * 300 + ".gguf")
    with (
        pytest.raises(ModelLoadError, match="does not exist") as raised,
        verified_file(long_name, None),
    ):
        pass
    assert raised.value.http_status == 404
