"""LogitMasker: every branch (few allowed, nearly all allowed, mixed) writes exactly the
reference mask, -inf where forbidden and the logit unchanged where allowed; nothing allowed
is an error. Pure numpy logic over a ctypes float buffer: the matcher is a fake that fills
a given bitmask."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferflux.engine.backends.llama_cpp_sampler import LogitMasker
from inferflux.errors import EngineError

N_VOCAB = 1000  # not a multiple of 32: the last mask word is partial


class FakeMatcher:
    """Fills the mask words with a fixed allowed set (GrammarMatcher.fill_mask's contract)."""

    def __init__(self, allowed: set[int]) -> None:
        bits = np.zeros(N_VOCAB, dtype=np.uint8)
        bits[sorted(allowed)] = 1
        packed = np.packbits(bits, bitorder="little")
        self.words = np.zeros((N_VOCAB + 31) // 32 * 4, dtype=np.uint8)
        self.words[: packed.size] = packed

    def fill_mask(self, words: np.ndarray) -> None:
        words.view(np.uint8)[:] = self.words


def masked(allowed: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """(logits before, logits after the masker) for `allowed`."""
    before = np.random.default_rng(0).standard_normal(N_VOCAB).astype(np.float32)
    row = (ctypes.c_float * N_VOCAB)(*before)
    LogitMasker(N_VOCAB).apply(FakeMatcher(allowed), row)  # type: ignore[arg-type]
    return before, np.ctypeslib.as_array(row)


def expected(before: np.ndarray, allowed: set[int]) -> np.ndarray:
    reference = np.full(N_VOCAB, -np.inf, dtype=np.float32)
    ids = sorted(allowed)
    reference[ids] = before[ids]
    return reference


@pytest.mark.parametrize(
    "allowed",
    [
        {7},  # structure: one token allowed (the "keep the few" branch)
        set(range(0, N_VOCAB, 97)),
        set(range(N_VOCAB)) - {3, 999},  # inside a string: nearly all (the "set the few" branch)
        set(range(N_VOCAB)),
        set(range(0, N_VOCAB, 2)),  # mixed: the bias-table branch
    ],
)
def test_each_branch_writes_the_reference_mask(allowed: set[int]) -> None:
    before, after = masked(allowed)
    np.testing.assert_array_equal(after, expected(before, allowed))


@given(st.sets(st.integers(0, N_VOCAB - 1), min_size=1))
def test_any_allowed_set_gives_the_reference_mask(allowed: set[int]) -> None:
    before, after = masked(allowed)
    np.testing.assert_array_equal(after, expected(before, allowed))


def test_nothing_allowed_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="admits no next token"):
        masked(set())
