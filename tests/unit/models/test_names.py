"""NameTable: ids, aliases and Ollama's `:latest` route to one registered spec; conflicts
change nothing; the default is what an empty name routes to."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferflux.errors import Conflict, ModelNotFound
from inferflux.models.names import NameTable
from inferflux.models.spec import ModelSpec


def spec(model_id: str, *aliases: str, default: bool = False) -> ModelSpec:
    return ModelSpec(model_id, Path(f"/m/{model_id}.gguf"), None, aliases, is_default=default)


def test_names_route_to_ids() -> None:
    names = NameTable(spec("a", "alpha", default=True), (spec("b"),))
    assert names.resolve(None) == names.resolve("") == "a"
    assert names.resolve("alpha") == names.resolve("alpha:latest") == "a"
    assert names.resolve("b:latest") == "b"
    with pytest.raises(ModelNotFound):
        names.resolve("c")
    assert names.spec("alpha").model_id == "a"


def test_a_conflicting_name_changes_nothing() -> None:
    names = NameTable(spec("a", "alpha", default=True))
    with pytest.raises(Conflict):
        names.register(spec("b", "alpha"))
    assert "b" not in names and names.resolve("alpha") == "a"
    names.register(spec("a", "first"))  # re-registering an id replaces its names
    assert names.resolve("first") == "a"
    with pytest.raises(ModelNotFound):
        names.resolve("alpha")


def test_the_default_moves_with_its_flag() -> None:
    names = NameTable(spec("a", default=True), (spec("b"),))
    names.set_default("b")
    assert names.resolve(None) == "b"
    assert [s.model_id for s in names if s.is_default] == ["b"]
    names.unregister("a")
    assert "a" not in names and [s.model_id for s in names] == ["b"]
