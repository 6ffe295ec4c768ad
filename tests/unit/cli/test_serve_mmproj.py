"""`inferflux serve --mmproj` and `--model vision`: the flags become model settings, and a
bad mmproj stops the server with exit 1 and a message naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferflux.cli import serve
from inferflux.models.files import default_model_path
from tests.unit.cli.test_serve import run_cli


def test_model_vision_is_the_default_model_with_the_demo_mmproj(monkeypatch, tmp_path) -> None:
    # the demo file itself (models/demo_vision.py) is built and tested elsewhere
    demo = tmp_path / "demo.mmproj.gguf"
    monkeypatch.setattr(serve, "_demo_mmproj_path", lambda: demo)
    monkeypatch.chdir(tmp_path)
    assert serve._model_overrides("vision", None, None) == {
        "model.path": str(default_model_path()),
        "model.mmproj": str(demo),
        "model.id": "vision",
    }
    chosen = serve._model_overrides("vision", "/m/p.gguf", "mine")
    assert (chosen["model.mmproj"], chosen["model.id"]) == ("/m/p.gguf", "mine")


def test_other_models_pass_through(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(serve, "_demo_mmproj_path", lambda: pytest.fail("not the demo"))
    assert serve._model_overrides("m.gguf", "p.gguf", None) == {
        "model.path": "m.gguf", "model.mmproj": "p.gguf", "model.id": None,
    }  # fmt: skip
    monkeypatch.chdir(tmp_path)
    Path("vision").write_bytes(b"")  # a file of that name is a model path
    assert serve._model_overrides("vision", None, None)["model.path"] == "vision"


def test_a_missing_mmproj_exits_1_naming_it() -> None:
    result = run_cli("serve", "--mmproj", "/nonexistent/mmproj.gguf", "--port", "18998")
    assert result.returncode == 1, result.stderr
    assert "mmproj file /nonexistent/mmproj.gguf does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_model_given_as_mmproj_exits_1(smollm2_model_path) -> None:
    result = run_cli("serve", "--mmproj", smollm2_model_path, "--port", "18997")
    assert result.returncode == 1, result.stderr
    assert "is not a vision projector GGUF" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_mmproj() -> None:
    result = run_cli("serve", "--help")
    assert "--mmproj" in result.stdout and "vision" in result.stdout
