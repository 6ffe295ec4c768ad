"""Reading the host's available memory, and the pressure watch (pure logic with a fake
reading where a reading is scripted)."""

from __future__ import annotations

from pathlib import Path

from inferflux.engine.host_memory import (
    MemoryWatch,
    _cgroup_headroom,
    _meminfo_available,
    available_bytes,
)


def test_this_host_reports_its_available_memory() -> None:
    available = available_bytes()
    assert available is not None and available > 64 * 1024 * 1024
    assert _meminfo_available() is not None


def test_a_cgroup_limit_gives_the_headroom_under_it(tmp_path: Path) -> None:
    (tmp_path / "memory.max").write_text("1073741824\n")
    (tmp_path / "memory.current").write_text("805306368\n")
    assert _cgroup_headroom(tmp_path) == 268435456
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_headroom(tmp_path) is None
    assert _cgroup_headroom(tmp_path / "absent") is None


def test_meminfo_without_the_field_reads_as_unknown(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\n")
    assert _meminfo_available(tmp_path / "meminfo") is None
    (tmp_path / "meminfo").write_text("MemAvailable:   2048 kB\n")
    assert _meminfo_available(tmp_path / "meminfo") == 2048 * 1024


def test_the_watch_reads_once_per_interval_and_counts_episodes() -> None:
    readings = iter([100, 50, 40, 200, 30])
    calls: list[int] = []

    def fake_available() -> int:
        calls.append(1)
        return next(readings)

    watch = MemoryWatch(read=fake_available, interval_s=1.0)
    assert not watch.poll(0.0, 60)  # 100
    assert not watch.poll(0.5, 60)  # not re-read
    assert watch.poll(1.0, 60) and watch.episodes == 1  # 50
    assert watch.poll(2.0, 60) and watch.episodes == 1  # 40: the same episode
    assert not watch.poll(3.0, 60)  # 200
    assert watch.poll(4.0, 60) and watch.episodes == 2  # 30
    assert len(calls) == 5
    assert not watch.poll(4.1, 0) and not watch.pressure  # low mark 0: off


def test_an_unknown_reading_is_no_pressure() -> None:
    watch = MemoryWatch(read=lambda: None)
    assert not watch.poll(0.0, 1 << 40) and watch.available is None
