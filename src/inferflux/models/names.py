"""`NameTable`: the registered models and every name that routes to one.

Owns: specs by model id, names (ids and aliases) → ids, Ollama's `name:latest` spelling,
the default model (what an empty name routes to), and the conflicts a new spec's names
would cause. Does not own which models are resident (residency.py) or loading them.
One event loop; nothing here awaits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from inferflux.errors import Conflict, ModelNotFound
from inferflux.models.spec import ModelSpec

OLLAMA_TAG = ":latest"


class NameTable:
    """Registered specs and their names. The default model is always registered."""

    def __init__(self, default: ModelSpec, others: tuple[ModelSpec, ...] = ()) -> None:
        self._specs: dict[str, ModelSpec] = {}
        self._names: dict[str, str] = {}
        self.default_id = default.model_id
        for spec in (default, *others):
            self.register(spec)

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(list(self._specs.values()))

    def get(self, model_id: str) -> ModelSpec | None:
        return self._specs.get(model_id)

    def spec(self, name: str | None, adapter: str | None = None) -> ModelSpec:
        """The spec `name` routes to (None/"": the default); with `adapter`, that model's
        adapter model `<id>:<adapter>`. Raises ModelNotFound."""
        model_id = self.resolve(name)
        if adapter is not None:
            model_id = self.resolve(f"{model_id}:{adapter}")
        return self._specs[model_id]

    def resolve(self, name: str | None) -> str:
        """The id `name` routes to (an id, an alias, either with `:latest`; None/"": the
        default). Raises ModelNotFound."""
        if not name:
            return self.default_id
        model_id = self._names.get(name)
        if model_id is None and name.endswith(OLLAMA_TAG):
            model_id = self._names.get(name.removesuffix(OLLAMA_TAG))
        if model_id is None:
            raise ModelNotFound(f"model '{name}' not found", param="model")
        return model_id

    def check(self, spec: ModelSpec) -> None:
        """Raise Conflict when one of the spec's names routes to another model."""
        for name in spec.names():
            owner = self._names.get(name)
            if owner is not None and owner != spec.model_id:
                raise Conflict(
                    f"the name {name!r} already routes to model {owner!r}", param="aliases"
                )

    def register(self, spec: ModelSpec) -> None:
        """Add or replace `spec`. Raises Conflict when one of its names belongs to another
        model (nothing changes then)."""
        self.check(spec)
        self.unregister(spec.model_id)
        self._specs[spec.model_id] = spec
        self._names.update(dict.fromkeys(spec.names(), spec.model_id))

    def unregister(self, model_id: str) -> None:
        old = self._specs.pop(model_id, None)
        for name in old.names() if old is not None else ():
            self._names.pop(name, None)

    def set_default(self, model_id: str) -> None:
        """Route the empty name to `model_id` (registered) and move the specs' flag."""
        for other in (self.default_id, model_id):
            spec = self._specs.get(other)
            if spec is not None:
                self._specs[other] = dataclasses.replace(spec, is_default=other == model_id)
        self.default_id = model_id
