"""verify_mmproj: the check every process makes before libmtmd reads a projector file
(hash, vision projector header), each refusal naming the mmproj and its field.

The projector files here are header-only stand-ins (tests/mmproj_header.py): nothing
loads them, so no image is encoded; this is a verification test, not a vision test.
"""

from __future__ import annotations

import os

import pytest

from inferflux.engine.model_verify import resolve_in_folder, verify_mmproj
from inferflux.errors import ModelFileNotFound, ModelLoadError, ModelVerificationFailed
from tests.mmproj_header import sha256_hex, write_projector_header


def test_a_projector_that_matches_its_hash_is_handed_over_as_the_open_file(tmp_path):
    path = write_projector_header(tmp_path / "mmproj.gguf")
    with verify_mmproj(path, sha256_hex(path).upper()) as load_path:
        assert load_path.startswith("/proc/self/fd/")
        assert os.path.samefile(load_path, path)
    with verify_mmproj(str(path), None) as load_path:  # no hash: the header is still checked
        assert os.path.samefile(load_path, path)


def test_a_mismatched_hash_refuses_it(tmp_path):
    path = write_projector_header(tmp_path / "mmproj.gguf")
    with pytest.raises(ModelVerificationFailed) as caught, verify_mmproj(path, "00" * 32):
        pytest.fail("the block must not run")
    assert caught.value.param == "mmproj_sha256"
    assert caught.value.message.startswith(f"mmproj file {path}")
    assert "does not match its SHA-256" in caught.value.message


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ModelFileNotFound) as caught, verify_mmproj(tmp_path / "nope.gguf", None):
        pass
    assert caught.value.param == "mmproj"
    assert caught.value.message == f"mmproj file {tmp_path / 'nope.gguf'} does not exist"


def _refusal(path, sha256=None) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as caught, verify_mmproj(path, sha256):
        pytest.fail("the block must not run")
    return caught.value


def test_a_text_model_is_not_a_projector(smollm2_model_path):
    error = _refusal(smollm2_model_path)
    assert isinstance(error, ModelVerificationFailed) and error.param == "mmproj"
    assert "not a vision projector GGUF" in error.message and "'llama'" in error.message


def test_an_audio_only_projector_and_junk_are_refused(tmp_path):
    audio = write_projector_header(tmp_path / "audio.gguf", has_vision=False)
    error = _refusal(audio)
    assert isinstance(error, ModelVerificationFailed)
    assert "not a vision projector" in error.message
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    error = _refusal(junk)
    assert isinstance(error, ModelVerificationFailed) and "is not a GGUF file" in error.message
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    error = _refusal(fifo)
    assert isinstance(error, ModelFileNotFound)
    assert error.message == f"mmproj path {fifo} is not a regular file"


def test_resolve_in_folder_names_the_mmproj_field(tmp_path):
    with pytest.raises(ModelVerificationFailed, match="mmproj '../p.gguf' resolves outside") as c:
        resolve_in_folder(tmp_path, "../p.gguf", param="mmproj")
    assert c.value.param == "mmproj"
    assert resolve_in_folder(tmp_path, "p.gguf", param="mmproj") == tmp_path.resolve() / "p.gguf"
