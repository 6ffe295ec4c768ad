"""The generation service is the only part of the API that talks to a model's engine.

Import contracts (pyproject.toml) keep dialects from importing the engine client, the
delta streams and the engine wrappers; this test closes the gap imports cannot see: a
dialect that reaches the engine through the `ServingState` it leased
(`serving.engine.generate(...)`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[3] / "src" / "inferflux" / "api"
DIALECTS = ("openai", "ollama", "native", "anthropic", "grpc", "admin", "tools")
ENGINE_CALLS = {"generate", "embed", "abort"}


def _engine_calls(path: Path) -> list[str]:
    """`<...>.engine.<generate|embed|abort>` attribute uses in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ENGINE_CALLS
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "engine"
        ):
            found.append(f"{path.name}:{node.lineno}: .engine.{node.attr}")
    return found


@pytest.mark.parametrize("dialect", DIALECTS)
def test_no_dialect_calls_the_engine(dialect: str) -> None:
    modules = sorted((API / dialect).rglob("*.py"))
    assert modules, f"no modules under {dialect}"
    assert [call for path in modules for call in _engine_calls(path)] == []


def test_the_scan_finds_an_engine_call() -> None:
    """The scan itself works: the generation service does call the engine."""
    assert _engine_calls(API / "generation" / "service.py")
