"""A model's mmproj from the `model` section or a manifest entry to the ModelInfo and the
per-model settings its workers get: folder rules, SHA-256 checks, the refused load.

The projector files are header-only stand-ins (tests/mmproj_header.py): the API process
only verifies them; no image is encoded here (not a vision test).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferflux.config.manifest import ManifestEntry
from inferflux.config.settings import Settings
from inferflux.engine.model_verify import SignatureVerifier
from inferflux.errors import (
    ConfigError,
    ModelFileNotFound,
    ModelLoadError,
    ModelVerificationFailed,
)
from inferflux.models.catalog import manifest_catalog, single_model_catalog
from inferflux.models.download import url_target
from inferflux.models.files import load_model
from inferflux.models.materialize import prepare_settings
from inferflux.models.resident import system_fingerprint
from inferflux.models.spec import entry_from_spec, model_settings, spec_from_entry
from tests.fakes.engine import fake_model_info
from tests.mmproj_header import serve_file, sha256_hex, write_projector_header

SHA = "ab" * 32
VERIFIER = SignatureVerifier((), require=False)


def _folder(tmp_path: Path, model_path: str) -> tuple[Path, Path]:
    """A models folder with the model (hard link) and a projector stand-in."""
    folder = tmp_path / "models"
    folder.mkdir()
    os.link(model_path, folder / "m.gguf")
    return folder, write_projector_header(folder / "mmproj.gguf")


def test_a_manifest_entry_resolves_its_mmproj_inside_the_folder(tmp_path):
    folder = tmp_path
    entry = ManifestEntry(
        id="v", path="m.gguf", sha256=SHA, mmproj="sub/p.gguf", mmproj_sha256=SHA.upper()
    )
    spec = spec_from_entry(entry, folder, VERIFIER, "manifest")
    assert spec.mmproj == folder.resolve() / "sub" / "p.gguf"
    assert spec.mmproj_sha256 == SHA
    own = model_settings(Settings(), spec)
    assert own.model.mmproj == str(spec.mmproj) and own.model.mmproj_sha256 == SHA
    # an Ollama copy or create starts from the same entry, mmproj included
    again = entry_from_spec(spec, folder, SHA)
    assert (again.mmproj, again.mmproj_sha256) == ("sub/p.gguf", SHA)


@pytest.mark.parametrize("mmproj", ["../p.gguf", "/etc/passwd"])
def test_an_mmproj_outside_the_folder_is_refused(tmp_path, mmproj):
    entry = ManifestEntry(id="v", path="m.gguf", sha256=SHA, mmproj=mmproj, mmproj_sha256=SHA)
    with pytest.raises(ModelVerificationFailed, match="resolves outside the models folder") as c:
        spec_from_entry(entry, tmp_path, VERIFIER, "manifest")
    assert c.value.param == "mmproj"


def test_an_mmproj_symlink_out_of_the_folder_is_refused(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    outside = write_projector_header(tmp_path / "elsewhere.gguf")
    (folder / "p.gguf").symlink_to(outside)
    entry = ManifestEntry(id="v", path="m.gguf", sha256=SHA, mmproj="p.gguf", mmproj_sha256=SHA)
    with pytest.raises(ModelVerificationFailed, match="resolves outside"):
        spec_from_entry(entry, folder, VERIFIER, "manifest")


def test_the_model_section_mmproj_reaches_the_spec_and_the_worker_settings(tmp_path):
    settings = Settings.model_validate(
        {"model": {"mmproj": str(tmp_path / "p.gguf"), "mmproj_sha256": SHA.upper()}}
    )
    plan = single_model_catalog(settings, tmp_path / "x.gguf")
    assert plan.default.mmproj == tmp_path.resolve() / "p.gguf"
    assert plan.default.mmproj_sha256 == SHA
    own = model_settings(settings, plan.default)
    assert own.model.mmproj == str(tmp_path.resolve() / "p.gguf")
    text_only = single_model_catalog(Settings(), tmp_path / "x.gguf").default
    assert text_only.mmproj is None and model_settings(Settings(), text_only).model.mmproj is None


def test_a_manifest_server_refuses_model_mmproj(tmp_path):
    manifest = tmp_path / "models.yaml"
    manifest.write_text(f"- {{id: a, path: a.gguf, sha256: {SHA}}}\n")
    settings = Settings.model_validate(
        {"registry": {"path": str(manifest)}, "model": {"mmproj": "p.gguf"}}
    )
    with pytest.raises(ConfigError, match="give the manifest entry its `mmproj`"):
        manifest_catalog(settings)


def test_load_model_verifies_the_mmproj_and_describes_a_vision_model(tmp_path, smollm2_model_path):
    folder, mmproj = _folder(tmp_path, smollm2_model_path)
    entry = ManifestEntry(
        id="v", path="m.gguf", sha256=sha256_hex(folder / "m.gguf"),
        mmproj="mmproj.gguf", mmproj_sha256=sha256_hex(mmproj),
    )  # fmt: skip
    spec = spec_from_entry(entry, folder, VERIFIER, "manifest")
    info, tokenizer = load_model(spec, model_settings(Settings(), spec))
    tokenizer.close()
    assert info.vision and info.mmproj == str(mmproj.resolve())
    assert info.mmproj_sha256 == sha256_hex(mmproj)
    text_only = dataclasses.replace(spec, mmproj=None, mmproj_sha256=None)
    info, tokenizer = load_model(text_only, model_settings(Settings(), text_only))
    tokenizer.close()
    assert not info.vision and info.mmproj == ""


def test_a_mismatched_mmproj_hash_refuses_the_load(tmp_path, smollm2_model_path):
    folder, mmproj = _folder(tmp_path, smollm2_model_path)
    entry = ManifestEntry(
        id="v", path="m.gguf", sha256=sha256_hex(folder / "m.gguf"),
        mmproj="mmproj.gguf", mmproj_sha256="00" * 32,
    )  # fmt: skip
    spec = spec_from_entry(entry, folder, VERIFIER, "manifest")
    with pytest.raises(ModelVerificationFailed, match="does not match its SHA-256") as caught:
        load_model(spec, model_settings(Settings(), spec))
    assert caught.value.param == "mmproj_sha256"
    assert str(mmproj.resolve()) in caught.value.message


def test_a_missing_mmproj_refuses_the_load(tmp_path, smollm2_model_path):
    folder, _ = _folder(tmp_path, smollm2_model_path)
    entry = ManifestEntry(
        id="v", path="m.gguf", sha256=sha256_hex(folder / "m.gguf"),
        mmproj="gone.gguf", mmproj_sha256=SHA,
    )  # fmt: skip
    spec = spec_from_entry(entry, folder, VERIFIER, "manifest")
    with pytest.raises(ModelFileNotFound, match="mmproj file .*gone.gguf does not exist"):
        load_model(spec, model_settings(Settings(), spec))


@pytest.fixture
def mmproj_url(tmp_path) -> Iterator[tuple[str, bytes, list[str]]]:
    data = write_projector_header(tmp_path / "served" / "mmproj.gguf").read_bytes()
    with serve_file(data, "/mmproj.gguf") as (url, gets):
        yield url, data, gets


def test_an_mmproj_url_is_downloaded_once_into_the_folder(tmp_path, mmproj_url):
    url, data, gets = mmproj_url
    sha = hashlib.sha256(data).hexdigest()
    folder = tmp_path / "models"
    entry = ManifestEntry(id="v", path="m.gguf", sha256=SHA, mmproj=url, mmproj_sha256=sha)
    with pytest.raises(ModelLoadError, match="is not downloaded") as caught:
        spec_from_entry(entry, folder, VERIFIER, "manifest")  # no fetch: nothing there yet
    assert caught.value.param == "mmproj"
    spec = spec_from_entry(entry, folder, VERIFIER, "manifest", fetch=True)
    assert spec.mmproj == url_target(folder, url, sha) and spec.mmproj.read_bytes() == data
    assert spec.mmproj_sha256 == sha and gets == ["/mmproj.gguf"]
    again = spec_from_entry(entry, folder, VERIFIER, "manifest", fetch=True)
    assert again.mmproj == spec.mmproj and gets == ["/mmproj.gguf"]  # not fetched again


def test_an_mmproj_url_with_the_wrong_hash_keeps_nothing(tmp_path, mmproj_url):
    url, _, _ = mmproj_url
    folder = tmp_path / "models"
    entry = ManifestEntry(id="v", path="m.gguf", sha256=SHA, mmproj=url, mmproj_sha256=SHA)
    with pytest.raises(ModelVerificationFailed, match="sha256 mismatch") as caught:
        spec_from_entry(entry, folder, VERIFIER, "manifest", fetch=True)
    assert caught.value.param == "mmproj_sha256"
    assert list(folder.iterdir()) == []


def test_a_model_section_mmproj_url_is_downloaded_before_serving(tmp_path, mmproj_url):
    url, data, _ = mmproj_url
    sha = hashlib.sha256(data).hexdigest()
    settings = Settings.model_validate(
        {"model": {"mmproj": url, "mmproj_sha256": sha},
         "registry": {"models_dir": str(tmp_path / "models")}}
    )  # fmt: skip
    prepared = prepare_settings(settings, lambda _: tmp_path / "m.gguf")
    assert prepared.model.mmproj == str(url_target(tmp_path / "models", url, sha))
    assert prepared.model.mmproj_sha256 == sha
    assert prepare_settings(Settings(), lambda _: tmp_path / "m.gguf") == Settings()


def test_the_system_fingerprint_follows_the_mmproj():
    text = fake_model_info()
    vision = dataclasses.replace(text, mmproj="/m/p.gguf", mmproj_sha256=SHA)
    other = dataclasses.replace(vision, mmproj_sha256="cd" * 32)
    fingerprints = {system_fingerprint(info) for info in (text, vision, other)}
    assert len(fingerprints) == 3
    assert system_fingerprint(text) == system_fingerprint(dataclasses.replace(text))
