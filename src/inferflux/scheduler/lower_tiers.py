"""The scheduler's view of the prefix cache's lower tiers (host RAM, disk).

The tiers themselves live in the engine (engine/kv_offload.py: they need llama.cpp and
files); the scheduler only asks, at admission, whether a lower tier holds a longer
prefix than the llama.cpp slots and is worth restoring, and if so emits a `KvRestore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LowerTierHit:
    """Restore entry `key`: it holds the first `length` tokens of the request."""

    key: str
    length: int


class LowerTiers(Protocol):
    def match(
        self, namespace: str, token_ids: list[int], *, max_length: int, have: int
    ) -> LowerTierHit | None:
        """An entry worth restoring that holds more than `have` leading tokens (at most
        `max_length`), or None."""
        ...
