"""The model manifest schema: entries, invariants, errors that name the entry, signatures' bytes."""

from __future__ import annotations

import json

import pytest

from inferflux.config.manifest import ManifestEntry, canonical_entry, parse_manifest, read_manifest
from inferflux.errors import ConfigError

SHA = "ab" * 32
ENTRY = f"""
models:
  - id: smollm2
    path: smollm2.gguf
    sha256: {SHA}
    aliases: [smol, tiny]
    n_ctx: 1024
    workers: 2
    n_batch: 256
    threads: 1
  - id: gemma
    path: sub/gemma.gguf
    sha256: {SHA.upper()}
    default: true
"""


def test_a_valid_manifest_parses_with_its_default():
    manifest = parse_manifest(ENTRY, "test")
    first, second = manifest.models
    assert first.names() == ("smollm2", "smol", "tiny") and first.n_ctx == 1024
    assert (first.workers, first.n_batch, first.threads) == (2, 256, 1)
    assert second.default and manifest.default_id() == "gemma"


def test_without_a_default_the_first_entry_is_it():
    text = ENTRY.replace("    default: true\n", "")
    assert parse_manifest(text, "test").default_id() == "smollm2"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("aliases: [smol, tiny]", "aliases: [gemma]"), "the name 'gemma' is used by both"),
        (("id: gemma", "id: smollm2"), "the name 'smollm2' is used by both"),
        (("  - id: smollm2\n", "  - id: smollm2\n    default: true\n"), "several entries"),
        ((f"sha256: {SHA}\n    aliases", "sha256: 1234\n    aliases"), "models[0].sha256"),
        (("n_ctx: 1024", "n_ctx: 8"), "models[0].n_ctx"),
        (("id: smollm2", "id: 'smol:latest'"), "models[0].id"),
        (("aliases: [smol, tiny]", "aliases: ['a b']"), "alias 'a b' must match"),
        (("threads: 1", "threads: 1\n    colour: red"), "models[0].colour: unknown key"),
        (("    path: smollm2.gguf\n", ""), "models[0].path"),
    ],
)
def test_invalid_manifests_name_the_entry_and_field(change, expected):
    text = ENTRY.replace(*change)
    with pytest.raises(ConfigError) as raised:
        parse_manifest(text, "test.yaml")
    assert expected in raised.value.message and "test.yaml" in raised.value.message


@pytest.mark.parametrize("text", ["models: [", "- a\n- b\n", "other: 1\n", ""])
def test_not_a_manifest_at_all(text):
    with pytest.raises(ConfigError, match="test.yaml"):
        parse_manifest(text, "test.yaml")


def test_read_manifest_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist: fix registry.path"):
        read_manifest(tmp_path / "missing.yaml")
    path = tmp_path / "m.yaml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_manifest(path)


def test_canonical_entry_covers_the_fields_written_without_the_signature():
    entry = ManifestEntry.model_validate(
        {"path": "a.gguf", "id": "m", "sha256": SHA, "n_ctx": 512, "signature": "c2ln"}
    )
    data = canonical_entry(entry)
    assert data == b'{"id":"m","n_ctx":512,"path":"a.gguf","sha256":"' + SHA.encode() + b'"}'
    assert json.loads(data) == {"id": "m", "n_ctx": 512, "path": "a.gguf", "sha256": SHA}
    # defaults that were not written stay out, so adding an optional field later keeps
    # every existing signature valid
    assert b"default" not in data and b"aliases" not in data


def test_the_list_inferctl_pull_writes_is_a_manifest():
    text = (
        f"- id: smollm2-135m-instruct-q8_0\n  path: /models/x/smollm2.gguf\n  sha256: {SHA}\n"
        "  source: hf://HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2.gguf@abc123\n"
    )
    manifest = parse_manifest(text, "models.yaml")
    (only,) = manifest.models
    assert only.source is not None and only.source.startswith("hf://")
    assert manifest.default_id() == "smollm2-135m-instruct-q8_0"
