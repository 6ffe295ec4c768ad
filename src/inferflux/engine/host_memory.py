"""How much memory the host (or the container) has left, for the engine's memory-pressure
mode (REQ-9.5).

Owns: reading the available bytes, the smaller of the kernel's `MemAvailable`
(/proc/meminfo) and the headroom under a cgroup v2 memory limit (memory.max −
memory.current, where a limit is set: a Kubernetes pod's), and `MemoryWatch`, which reads
it at most once per interval and says whether the engine is under pressure. Does not own
what pressure changes (the scheduler halves its admissions and step budget, EngineCore
evicts the prefix cache).

Why the cgroup too: in a container, MemAvailable describes the whole node; the pod is
OOM-killed at its own limit long before the node runs short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")


def _meminfo_available(path: Path = _MEMINFO) -> int | None:
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom(root: Path = _CGROUP) -> int | None:
    try:
        limit = (root / "memory.max").read_text(encoding="ascii").strip()
        if limit == "max":
            return None
        current = int((root / "memory.current").read_text(encoding="ascii").strip())
        return max(0, int(limit) - current)
    except (OSError, ValueError):
        return None


def available_bytes() -> int | None:
    """Bytes this process tree can still allocate, or None where nothing says."""
    readings = [r for r in (_meminfo_available(), _cgroup_headroom()) if r is not None]
    return min(readings) if readings else None


@dataclass(slots=True)
class MemoryWatch:
    """Pressure = available memory below a low mark; read at most every `interval_s`."""

    read: Callable[[], int | None] = available_bytes
    interval_s: float = 1.0
    available: int | None = None  # the latest reading
    pressure: bool = False
    episodes: int = 0  # times pressure began
    _read_at: float = float("-inf")

    def poll(self, now: float, low_bytes: int) -> bool:
        """Under pressure now? Re-reads when the interval has passed; `low_bytes` <= 0
        turns the watch off. True on the poll that starts an episode counts it."""
        if low_bytes <= 0:
            self.pressure = False
            return False
        if now - self._read_at >= self.interval_s:
            self._read_at = now
            self.available = self.read()
            was = self.pressure
            self.pressure = self.available is not None and self.available < low_bytes
            if self.pressure and not was:
                self.episodes += 1
        return self.pressure
