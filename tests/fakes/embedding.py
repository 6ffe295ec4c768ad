"""`FakeEmbeddingBackend`: the `EmbeddingBackend` seam for unit tests of `EmbedQueue`'s logic.

It runs no model: token t's "hidden state" is `token_vector(t)`, and a chunk's pooled
output is the mean of its tokens' vectors, exactly what llama.cpp's MEAN pooling returns
for the tokens of one ubatch. Real vectors are tested against llama.cpp in tests/integration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inferflux.errors import EngineError

FAKE_N_EMBD = 3


def token_vector(token: int) -> np.ndarray:
    return np.array([float(token), 1.0, float(token % 3)], dtype=np.float32)


def mean_vector(token_ids: list[int]) -> np.ndarray:
    return np.mean([token_vector(t) for t in token_ids], axis=0)


@dataclass
class FakeEmbeddingBackend:
    """Records every decoded chunk and freed sequence; `fail_on` tokens make a decode raise."""

    n_embd: int = FAKE_N_EMBD
    n_vocab: int = 1000
    n_seq_max: int = 4
    max_batch_tokens: int = 16
    max_seq_tokens: int = 64
    splits_sequences: bool = True
    fail_on: set[int] = field(default_factory=set)
    batches: list[list[tuple[int, list[int], int, int]]] = field(default_factory=list)
    freed: list[int] = field(default_factory=list)
    closed: bool = False

    def decode(self, chunks: list[tuple[int, list[int], int, int]]) -> list[np.ndarray]:
        self.batches.append([(s, list(t), p, n) for s, t, p, n in chunks])
        if any(t in self.fail_on for _, tokens, _, _ in chunks for t in tokens):
            raise EngineError("fake decode failure")
        return [mean_vector(tokens) for _, tokens, _, _ in chunks]

    def free_seq(self, seq_id: int) -> None:
        self.freed.append(seq_id)

    def close(self) -> None:
        self.closed = True
