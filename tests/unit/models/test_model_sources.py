"""Pure logic of model URLs, quantization levels and Ollama pull names (no network, no
llama.cpp): what is accepted, what is refused and with which message."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from inferflux.api.ollama.pull import NOT_FOUND, pull_source
from inferflux.config.manifest import ManifestEntry
from inferflux.config.registry_settings import RegistrySettings
from inferflux.config.settings import ModelSettings
from inferflux.errors import InvalidRequest, ModelFileNotFound, QuantizationRefused
from inferflux.models.download import HubRef, parse_hf_url, url_target
from inferflux.models.materialize import needs_preparation
from inferflux.models.quantize import LEVEL_FTYPES, check_level, quantized_path

SHA = "ab" * 32


def test_an_hf_url_entry_needs_no_sha256_but_an_https_one_does() -> None:
    entry = ManifestEntry.model_validate({"id": "m", "path": "hf://org/repo/m.gguf@v1"})
    assert entry.sha256 is None
    with pytest.raises(ValidationError, match="http\\(s\\) URL: set its sha256"):
        ManifestEntry.model_validate({"id": "m", "path": "https://example.com/m.gguf"})
    with pytest.raises(ValidationError, match="sha256 is required"):
        ManifestEntry.model_validate({"id": "m", "path": "m.gguf"})
    ok = ManifestEntry.model_validate(
        {"id": "m", "path": "https://example.com/m.gguf", "sha256": SHA, "quantization": "Q8_0"}
    )
    assert ok.quantization == "Q8_0"


@pytest.mark.parametrize(
    "url", ["hf://org/m.gguf", "hf://org/repo/m.bin", "hf://org/repo/", "hf://org/repo/../m.gguf"]
)
def test_a_malformed_hf_url_is_refused_with_the_expected_form(url: str) -> None:
    with pytest.raises(ValidationError, match="expected hf://ORG/REPO/FILE.gguf"):
        ManifestEntry.model_validate({"id": "m", "path": url})


def test_an_unknown_quantization_level_is_refused() -> None:
    with pytest.raises(ValidationError, match="quantization"):
        ManifestEntry.model_validate({"id": "m", "path": "m.gguf", "sha256": SHA,
                                      "quantization": "Q9_X"})  # fmt: skip


def test_model_settings_refuse_an_https_url_without_sha256() -> None:
    with pytest.raises(ValidationError, match="model.path .* set its sha256"):
        ModelSettings(path="https://example.com/m.gguf")
    settings = ModelSettings(path="hf://org/repo/m.gguf", quantization="Q4_K_M")
    assert needs_preparation(settings.path, settings.quantization)
    assert not needs_preparation("/models/m.gguf", None)
    assert needs_preparation("/models/m.gguf", "Q8_0")


def test_pull_sources_must_be_hf_urls() -> None:
    with pytest.raises(ValidationError, match="pull_sources\\['smol'\\]"):
        RegistrySettings(pull_sources={"smol": "https://example.com/m.gguf"})
    with pytest.raises(ValidationError, match="the name 'a:b' must match"):
        RegistrySettings(pull_sources={"a:b": "hf://o/r/m.gguf"})
    assert RegistrySettings(pull_sources={"smol": "hf://o/r/m.gguf"}).pull_sources


def test_parse_hf_url_splits_repo_file_and_revision() -> None:
    assert parse_hf_url("hf://org/repo/sub/m.gguf@abc") == HubRef("org/repo", "sub/m.gguf", "abc")
    assert parse_hf_url("hf://org/repo/m.gguf").revision == "main"


@pytest.mark.parametrize("url", ["hf://org/repo/../../etc/m.gguf", "hf://../repo/m.gguf"])
def test_parse_hf_url_refuses_dot_dot_parts(url: str) -> None:
    with pytest.raises(InvalidRequest, match="no empty, . or .. parts"):
        parse_hf_url(url)


def test_an_https_download_is_named_by_its_sha256() -> None:
    target = url_target(Path("/m"), "https://cdn.example.com/a/tiny.gguf?sig=secret", SHA)
    assert target == Path(f"/m/tiny.{SHA[:12]}.gguf")


def test_only_higher_precision_files_are_quantized_down() -> None:
    assert check_level("F16", "Q8_0", "f.gguf")
    assert check_level("F32", "F16", "f.gguf")
    assert check_level("Q8_0", "Q4_K_M", "f.gguf")
    assert not check_level("Q4_K_M", "Q4_K_M", "f.gguf")  # already there: served as is
    with pytest.raises(QuantizationRefused, match="f.gguf is Q4_1: quantizing it to Q8_0"):
        check_level("Q4_1", "Q8_0", "f.gguf")
    with pytest.raises(QuantizationRefused, match="would not lower"):
        check_level("F16", "BF16", "f.gguf")
    with pytest.raises(QuantizationRefused, match="unknown quantization"):
        check_level("F16", "Q9_X", "f.gguf")


def test_quantization_levels_map_to_llama_ftypes() -> None:
    assert LEVEL_FTYPES["Q4_K_M"] == 15 and LEVEL_FTYPES["Q8_0"] == 7 and LEVEL_FTYPES["F16"] == 1
    path = quantized_path(Path("/src/tiny.f16.gguf"), SHA, "Q8_0", Path("/cache"))
    assert path == Path(f"/cache/tiny.f16.Q8_0.{SHA[:12]}.gguf")


def test_ollama_names_map_to_hub_files_or_configured_sources() -> None:
    plain = pull_source("hf.co/acme/tiny-GGUF", {})
    assert plain.model_id == "hf.co/acme/tiny-GGUF" and plain.ref.filename is None
    by_file = pull_source("hf.co/acme/tiny-GGUF:tiny.f16.gguf", {})
    assert by_file.ref == HubRef("acme/tiny-GGUF", "tiny.f16.gguf")
    by_label = pull_source("huggingface.co/acme/tiny-GGUF:Q8_0", {})
    assert by_label.label == "Q8_0" and by_label.model_id == "hf.co/acme/tiny-GGUF"
    configured = pull_source("smol:latest", {"smol": "hf://acme/s/s.gguf@v2"})
    assert configured.model_id == "smol" and configured.ref == HubRef("acme/s", "s.gguf", "v2")


def test_an_unknown_ollama_name_is_ollamas_not_found() -> None:
    with pytest.raises(ModelFileNotFound, match=NOT_FOUND):
        pull_source("llama3.2", {})
    with pytest.raises(InvalidRequest, match="expected ORG/REPO"):
        pull_source("hf.co/acme/tiny/../x:f.gguf", {})
