"""The start-up calibration of verification row costs (engine/spec_cost.py), on a fake
backend whose decode advances a fake clock by a known cost per row count."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from inferflux.engine import spec_cost
from inferflux.engine.backends.base import DecodeChunk, SamplerHandle


def _sawtooth(rows: int) -> float:
    """ms of a step: 4 rows at a time cheap, leftover rows dear (Gemma-like)."""
    return 10.0 + 3.0 * rows + 8.0 * (rows % 4)


class FakeBackend:
    """A fake: decode costs `_sawtooth(rows)` ms of the fake clock; nothing computed."""

    n_vocab = 1000

    def __init__(self, n_ctx_per_seq: int) -> None:
        self.n_ctx_per_seq = n_ctx_per_seq
        self.now = 0.0
        self.widths: list[int] = []

    def decode(self, chunks: list[DecodeChunk]) -> list[int]:
        rows = chunks[0][3]
        if rows:
            self.now += _sawtooth(rows) / 1000
            self.widths.append(rows)
        return [len(chunks[0][1]) - 1]

    def sample(self, sampler: SamplerHandle, batch_index: int) -> int:
        return 0

    def trim_seq(self, seq_id: int, n_tokens: int) -> bool:
        return True

    def free_seq(self, seq_id: int) -> None:
        pass


def _sampler() -> SamplerHandle:
    return cast(SamplerHandle, object())  # the fake samples nothing


def test_the_calibration_prices_every_row_count_from_the_widths_it_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = FakeBackend(n_ctx_per_seq=4096)
    monkeypatch.setattr(spec_cost, "time", SimpleNamespace(perf_counter=lambda: backend.now))
    cost = spec_cost.measure_step_cost(backend, 7, _sampler)
    assert sorted(set(backend.widths)) == [*range(1, 9), 16, 32]
    one = _sawtooth(1)
    for rows in (*range(1, 9), 12, 13, 16, 31, 32):  # measured, or modelled exactly
        assert cost(rows) == pytest.approx(_sawtooth(rows) / one, abs=1e-3)
    assert len(cost.table) == 36 and cost(8) < cost(7)


def test_a_small_context_measures_no_wider_than_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend(n_ctx_per_seq=64 + 20)  # room for 20 rows past the context
    monkeypatch.setattr(spec_cost, "time", SimpleNamespace(perf_counter=lambda: backend.now))
    cost = spec_cost.measure_step_cost(backend, 0, _sampler)
    assert max(backend.widths) == 16 and len(cost.table) == 20
