"""docs/configuration.md is exactly what scripts/gen_config_docs.py generates from the schema."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from inferflux.config.loader import ENV_ALIASES, load_settings
from inferflux.config.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gen_config_docs.py"
DOCS = ROOT / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_config_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_match_the_schema(gen):
    assert DOCS.read_text(encoding="utf-8") == gen.render(), (
        "docs/configuration.md is stale: run `.venv/bin/python scripts/gen_config_docs.py`"
    )


def test_render_is_deterministic(gen):
    assert gen.render() == gen.render()


def test_check_mode_passes_on_fresh_docs(gen):
    assert gen.main(["--check"]) == 0


def _leaves(model, prefix):
    """(dotted section, key) of every leaf key, nested sections included."""
    for key, field in model.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            yield from _leaves(sub, (*prefix, key))
        else:
            yield prefix, key


def test_every_key_and_env_name_is_documented(gen):
    text = gen.render()
    for section in Settings.model_fields:
        assert f"## `{section}`" in text
    for path, key in _leaves(Settings, ()):
        assert f"| `{key}` |" in text
        env = "__".join(p.upper() for p in (*path, key))
        assert f"`INFERFLUX_{env}`" in text
    for alias in ENV_ALIASES:
        assert f"`{alias}`" in text


def test_yaml_example_loads_to_the_defaults(gen, tmp_path):
    block = re.search(r"```yaml\n(.*?)```", gen.render(), re.DOTALL)
    assert block is not None
    path = tmp_path / "example.yaml"
    path.write_text(block.group(1), encoding="utf-8")
    assert yaml.safe_load(block.group(1)).keys() == Settings.model_fields.keys()
    assert load_settings(path, env={}) == Settings()
