"""How the backend groups image rows into llama_decode calls (pure logic)."""

from __future__ import annotations

import numpy as np

from inferflux.engine.backends.llama_cpp import _within


def rows(seq: int, n: int) -> tuple[int, int, np.ndarray, bool]:
    return (seq, 0, np.zeros((n, 2), dtype=np.float32), False)


def test_rows_are_grouped_within_the_batch_in_order() -> None:
    groups = _within([rows(0, 3), rows(1, 2), rows(2, 4), rows(3, 1)], 5)
    assert [[r[0] for r in g] for g in groups] == [[0, 1], [2, 3]]


def test_a_chunk_is_never_split() -> None:
    groups = _within([rows(0, 2), rows(1, 6)], 5)
    assert [[r[0] for r in g] for g in groups] == [[0], [1]]
