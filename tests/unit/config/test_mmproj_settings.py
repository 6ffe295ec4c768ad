"""model.mmproj and a manifest entry's mmproj: what the schema takes and what it refuses,
each refusal naming the key and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferflux.config.loader import load_settings
from inferflux.config.manifest import ManifestEntry, canonical_entry
from inferflux.config.settings import Settings
from inferflux.errors import ConfigError

SHA = "ab" * 32


def test_model_mmproj_from_the_environment_and_yaml(tmp_path):
    settings = load_settings(env={"INFERFLUX_MODEL__MMPROJ": "/models/mmproj.gguf"})
    assert settings.model.mmproj == "/models/mmproj.gguf"
    assert settings.model.mmproj_sha256 is None
    config = tmp_path / "c.yaml"
    config.write_text(f"model:\n  mmproj: m.gguf\n  mmproj_sha256: {SHA}\n")
    settings = load_settings(config, env={})
    assert (settings.model.mmproj, settings.model.mmproj_sha256) == ("m.gguf", SHA)


def test_text_only_by_default():
    assert Settings().model.mmproj is None


def test_an_mmproj_may_be_a_url_like_the_model():
    model = Settings.model_validate({"model": {"mmproj": "hf://org/repo/mmproj.gguf"}}).model
    assert model.mmproj == "hf://org/repo/mmproj.gguf"  # the hub's hash is checked
    entry = ManifestEntry(id="v", path="m.gguf", sha256=SHA, mmproj="hf://o/r/p.gguf@main")
    assert entry.mmproj_sha256 is None


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ({"mmproj": "m.gguf", "mmproj_sha256": "12"}, "mmproj_sha256"),
        ({"mmproj_sha256": SHA}, "model.mmproj_sha256 is set but model.mmproj is not"),
        ({"mmproj": "https://example.com/m.gguf"}, "set its sha256"),
        ({"mmproj": "hf://org/repo"}, "expected hf://ORG/REPO/FILE.gguf"),
    ],
)
def test_model_mmproj_refusals(model, expected):
    with pytest.raises(ValidationError, match=expected):
        Settings.model_validate({"model": model})


def test_a_bad_mmproj_sha256_from_the_environment_names_the_variable():
    with pytest.raises(ConfigError, match="INFERFLUX_MODEL__MMPROJ_SHA256"):
        load_settings(
            env={"INFERFLUX_MODEL__MMPROJ": "m.gguf", "INFERFLUX_MODEL__MMPROJ_SHA256": "xyz"}
        )


def test_a_manifest_entry_takes_an_mmproj_with_its_sha256():
    entry = ManifestEntry(id="v", path="m.gguf", sha256=SHA, mmproj="p.gguf", mmproj_sha256=SHA)
    assert entry.mmproj == "p.gguf"
    # the signature covers the mmproj too: another projector is another entry
    assert b'"mmproj":"p.gguf"' in canonical_entry(entry)
    assert b'"mmproj_sha256"' in canonical_entry(entry)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"mmproj": "p.gguf"}, "mmproj_sha256 is required .* except for an hf:// URL"),
        ({"mmproj": "p.gguf", "mmproj_sha256": "ab"}, "mmproj_sha256"),
        ({"mmproj_sha256": SHA}, "mmproj_sha256 is set but mmproj is not"),
        ({"mmproj": "https://h/p.gguf"}, "set its sha256"),
        ({"mmproj": "hf://org/repo/../p.gguf"}, "expected hf://ORG/REPO/FILE.gguf"),
        ({"mmproj": ""}, "mmproj"),
    ],
)
def test_manifest_entry_mmproj_refusals(fields, expected):
    with pytest.raises(ValidationError, match=expected):
        ManifestEntry.model_validate({"id": "v", "path": "m.gguf", "sha256": SHA, **fields})
