"""The start-up calibration of verification row costs (engine/spec_cost.py), on a fake
backend whose decode advances a fake clock by a known cost per row count, and its record
across starts."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from inferflux.engine import spec_cost
from inferflux.engine.backends.base import DecodeChunk, SamplerHandle
from inferflux.engine.backends.llama_cpp import ContextConfig
from inferflux.engine.speculative import StepCost


def _sawtooth(rows: int) -> float:
    """ms of a step: 4 rows at a time cheap, leftover rows dear (Gemma-like)."""
    return 10.0 + 3.0 * rows + 8.0 * (rows % 4)


class FakeBackend:
    """A fake: decode costs `_sawtooth(rows)` ms of the fake clock; nothing computed."""

    n_vocab = 1000

    def __init__(self, n_ctx_per_seq: int, noise: dict[int, float] | None = None) -> None:
        self.n_ctx_per_seq = n_ctx_per_seq
        self.now = 0.0
        self.widths: list[int] = []
        self.noise = noise or {}  # ms added to every step of that many rows

    def decode(self, chunks: list[DecodeChunk]) -> list[int]:
        rows = chunks[0][3]
        if rows:
            self.now += (_sawtooth(rows) + self.noise.get(rows, 0.0)) / 1000
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


def _calibrate(monkeypatch: pytest.MonkeyPatch, backend: FakeBackend) -> StepCost:
    """`backend`'s calibration, without a record, on its fake clock."""
    monkeypatch.setattr(spec_cost, "time", SimpleNamespace(perf_counter=lambda: backend.now))
    return spec_cost.calibrated_step_cost(backend, 7, _sampler, None, "k")


def test_the_calibration_prices_every_row_count_from_the_widths_it_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = FakeBackend(n_ctx_per_seq=4096)
    cost = _calibrate(monkeypatch, backend)
    assert sorted(set(backend.widths)) == [*range(1, 9), 16, 32]
    one = _sawtooth(1)
    for rows in (*range(1, 9), 12, 13, 16, 31, 32):  # measured, or modelled exactly
        assert cost(rows) == pytest.approx(_sawtooth(rows) / one, abs=1e-3)
    assert len(cost.table) == 36 and cost(8) < cost(7)


def test_a_small_context_measures_no_wider_than_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend(n_ctx_per_seq=64 + 20)  # room for 20 rows past the context
    monkeypatch.setattr(spec_cost, "time", SimpleNamespace(perf_counter=lambda: backend.now))
    cost = spec_cost.calibrated_step_cost(backend, 0, _sampler, None, "k")
    assert max(backend.widths) == 16 and len(cost.table) == 20


class FakeBurstyBackend(FakeBackend):
    """A fake whose one-row steps from the 2nd to the `last` take 40 ms more: other work
    on the machine while the calibration's first widths ran."""

    def __init__(self, last: int) -> None:
        super().__init__(n_ctx_per_seq=4096)
        self.last = last
        self.one_row_steps = 0

    def decode(self, chunks: list[DecodeChunk]) -> list[int]:
        if chunks[0][3] == 1:
            self.one_row_steps += 1
            if 2 <= self.one_row_steps <= self.last:
                self.now += 0.040
        return super().decode(chunks)


def test_a_burst_over_some_one_row_steps_still_prices_a_second_row_above_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the one-row steps of the warm-up and the first measured widths ran slow: the
    # fastest one-row step of the rest is the denominator (when each pass timed it once,
    # two slow samples priced two rows at one)
    backend = FakeBurstyBackend(last=14)
    cost = _calibrate(monkeypatch, backend)
    assert backend.one_row_steps > 14
    assert cost.second_row == pytest.approx(_sawtooth(2) / _sawtooth(1) - 1.0, abs=1e-3)
    assert cost(8) == pytest.approx(_sawtooth(8) / _sawtooth(1), abs=1e-3)


def _start(
    monkeypatch: pytest.MonkeyPatch, record: Path, noise: dict[int, float] | None = None
) -> tuple[FakeBackend, StepCost]:
    """One worker start's calibration against `record`, on a fresh fake backend."""
    backend = FakeBackend(n_ctx_per_seq=4096, noise=noise)
    monkeypatch.setattr(spec_cost, "time", SimpleNamespace(perf_counter=lambda: backend.now))
    return backend, spec_cost.calibrated_step_cost(backend, 7, _sampler, record, "model-a")


def test_the_record_keeps_each_widths_fastest_and_is_read_once_settled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "cache" / "step-cost.json"
    # a busy first start: the 16-row step and the one-row step took longer than they cost
    busy, first = _start(monkeypatch, record, noise={16: 40.0, 1: 6.0})
    assert busy.widths and first(16) != pytest.approx(_sawtooth(16) / _sawtooth(1), abs=1e-3)
    for _ in range(spec_cost.SETTLED_STARTS - 1):  # quiet starts: measured and merged
        quiet, cost = _start(monkeypatch, record)
        assert quiet.widths
    one = _sawtooth(1)
    for rows in (1, 2, 7, 8, 16, 32):
        assert cost(rows) == pytest.approx(_sawtooth(rows) / one, abs=1e-3)
    settled, again = _start(monkeypatch, record, noise={16: 40.0})  # read, not measured
    assert settled.widths == [] and again.table == cost.table
    entry = json.loads(record.read_text())["entries"]["model-a"]
    assert entry["starts"] == spec_cost.SETTLED_STARTS
    assert entry["seconds"]["16"] == pytest.approx(_sawtooth(16) / 1000)


def test_another_key_or_context_size_measures_for_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = tmp_path / "step-cost.json"
    for _ in range(spec_cost.SETTLED_STARTS):
        _start(monkeypatch, record)
    narrow = FakeBackend(n_ctx_per_seq=64 + 20)  # widths up to 16: the entry's do not fit
    monkeypatch.setattr(spec_cost, "time", SimpleNamespace(perf_counter=lambda: narrow.now))
    spec_cost.calibrated_step_cost(narrow, 0, _sampler, record, "model-a")
    assert max(narrow.widths) == 16
    other = FakeBackend(n_ctx_per_seq=4096)
    monkeypatch.setattr(spec_cost, "time", SimpleNamespace(perf_counter=lambda: other.now))
    spec_cost.calibrated_step_cost(other, 0, _sampler, record, "model-b")
    assert other.widths
    assert set(json.loads(record.read_text())["entries"]) == {"model-a", "model-b"}


def test_a_corrupt_or_unwritable_record_only_costs_a_measurement(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = tmp_path / "step-cost.json"
    record.write_text('{"entries": {"model-a": {"seconds": {"1": -3}, "starts": 9}}')
    backend, cost = _start(monkeypatch, record)
    assert backend.widths and cost(8) < cost(7)
    assert json.loads(record.read_text())["entries"]["model-a"]["starts"] == 1
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    backend, cost = _start(monkeypatch, blocked / "step-cost.json")  # its folder is a file
    assert backend.widths and cost(8) < cost(7)
    assert "could not record the step costs" in caplog.text


def test_the_record_key_changes_with_the_model_file_threads_and_kv_mode(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 100)
    context = ContextConfig(str(model), 512, 4, 256, 2, 2, False)
    key = spec_cost.record_key(context)
    assert key == spec_cost.record_key(context)  # stable: the same entry at the next start
    others = [
        dataclasses.replace(context, n_threads=1),
        dataclasses.replace(context, n_threads_batch=4),
        dataclasses.replace(context, kv_unified=True),
        dataclasses.replace(context, n_gpu_layers=-1),
    ]
    assert all(spec_cost.record_key(c) != key for c in others)
    model.write_bytes(b"y" * 100)  # another file at the same path: a new mtime
    os.utime(model, ns=(1, 1))
    assert spec_cost.record_key(context) != key
