"""The plan a server starts with: the manifest's entries checked up front, per-model settings."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from inferflux.config.manifest import ManifestEntry, canonical_entry
from inferflux.config.settings import Settings
from inferflux.errors import ConfigError, ModelVerificationFailed
from inferflux.models.catalog import manifest_catalog, single_model_catalog
from inferflux.models.spec import model_settings

SHA = "ab" * 32


def _settings(**registry) -> Settings:
    return Settings.model_validate({"registry": registry})


def _manifest(tmp_path, text: str):
    path = tmp_path / "manifest.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_manifest_plan_resolves_paths_and_picks_the_default(tmp_path):
    path = _manifest(
        tmp_path,
        f"models:\n  - {{id: a, path: a.gguf, sha256: {SHA}}}\n"
        f"  - {{id: b, path: sub/b.gguf, sha256: {SHA}, default: true, n_ctx: 512}}\n",
    )
    plan = manifest_catalog(_settings(path=str(path)))
    assert plan.default.model_id == "b" and plan.default.is_default
    assert plan.default.path == (tmp_path / "sub" / "b.gguf").resolve()
    assert [s.model_id for s in plan.others] == ["a"] and plan.manifest_path == path.resolve()
    assert plan.models_dir == tmp_path.resolve() and plan.default.source == "manifest"


def test_models_dir_overrides_the_manifest_folder(tmp_path):
    path = _manifest(tmp_path, f"models:\n  - {{id: a, path: ../a.gguf, sha256: {SHA}}}\n")
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelVerificationFailed, match=r"manifest\.yaml: model path '\.\./a"):
        manifest_catalog(_settings(path=str(path), models_dir=str(tmp_path / "m")))


def test_manifest_plan_refusals(tmp_path):
    empty = _manifest(tmp_path, "models: []\n")
    with pytest.raises(ConfigError, match="lists no models"):
        manifest_catalog(_settings(path=str(empty)))
    both = Settings.model_validate({"registry": {"path": str(empty)}, "model": {"path": "/x.gguf"}})
    with pytest.raises(ConfigError, match="both model.path and registry.path"):
        manifest_catalog(both)


def test_signatures_are_checked_at_startup(tmp_path):
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))
    entry = ManifestEntry.model_validate({"id": "a", "path": "a.gguf", "sha256": SHA})
    signature = base64.b64encode(key.sign(canonical_entry(entry))).decode()
    good = _manifest(
        tmp_path, f"models:\n  - {{id: a, path: a.gguf, sha256: {SHA}, signature: '{signature}'}}\n"
    )
    settings = _settings(path=str(good), public_keys=[public.decode()], require_signatures=True)
    assert manifest_catalog(settings).default.model_id == "a"
    (tmp_path / "manifest.yaml").write_text(
        f"models:\n  - {{id: a, path: b.gguf, sha256: {SHA}, signature: '{signature}'}}\n"
    )
    with pytest.raises(ModelVerificationFailed, match="signature of model 'a' does not verify"):
        manifest_catalog(settings)


def test_per_model_settings_override_the_server_wide_ones(tmp_path):
    settings = Settings.model_validate(
        {"runtime": {"workers": 3}, "scheduler": {"max_batch_tokens": 128}}
    )
    path = _manifest(
        tmp_path,
        f"models:\n  - {{id: a, path: a.gguf, sha256: {SHA}, workers: 1, n_batch: 64, "
        "threads: 2, n_ctx: 256}\n",
    )
    plan = manifest_catalog(_settings(path=str(path)))
    own = model_settings(settings, plan.default)
    assert (own.runtime.workers, own.runtime.n_threads) == (1, 2)
    assert own.scheduler.max_batch_tokens == 64 and own.model.ctx_size == 256
    assert own.model.id == "a" and own.model.sha256 == SHA
    assert settings.runtime.workers == 3  # the server-wide settings are left alone


def test_single_model_plan_keeps_model_path_working(tmp_path):
    settings = Settings.model_validate({"model": {"id": "mine", "sha256": SHA.upper()}})
    plan = single_model_catalog(settings, tmp_path / "x.gguf")
    assert plan.default.model_id == "mine" and plan.default.sha256 == SHA
    assert plan.default.source == "config" and plan.models_dir == tmp_path
    assert plan.others == () and plan.manifest_path is None
