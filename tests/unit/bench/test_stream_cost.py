"""bench/stream_cost.py: per-thread samples read from /proc, and their per-token deltas."""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
stream_cost = importlib.import_module("stream_cost")


def test_thread_samples_reads_every_thread_of_this_process() -> None:
    release = threading.Event()
    helper = threading.Thread(target=release.wait)
    helper.start()
    try:
        samples = stream_cost.thread_samples(os.getpid())
    finally:
        release.set()
        helper.join()
    assert os.getpid() in samples  # the main thread's tid is the pid
    assert helper.native_id in samples
    main = samples[os.getpid()]
    assert main.cpu_s > 0 and main.voluntary >= 0 and main.involuntary >= 0


def test_per_token_divides_deltas_and_skips_threads_that_started_later() -> None:
    sample = stream_cost.ThreadSample
    before = {1: sample("main", 10, 5, 1.0), 2: sample("io", 0, 0, 0.0)}
    after = {
        1: sample("main", 110, 25, 1.5),
        2: sample("io", 50, 0, 0.01),
        3: sample("new", 999, 999, 9.0),  # not in `before`: left out
    }
    result = stream_cost.per_token(before, after, tokens=100)
    assert [t["tid"] for t in result["threads"]] == [1, 2]
    assert result["voluntary"] == 1.5  # (100 + 50) / 100
    assert result["involuntary"] == 0.2
    assert abs(result["cpu_ms"] - 5.1) < 1e-9  # (0.5 s + 0.01 s) * 1000 / 100
