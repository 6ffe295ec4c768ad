"""Peak resident memory of a process tree, sampled from /proc (Linux; standard library).

`TreeSampler(pid)` runs a daemon thread that every `interval_s` sums VmRSS over `pid` and
all its descendants, and remembers the peak of the tree and of each process (by pid, with
its command name). `reset()` starts a new measurement window (one per benchmark level).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


def _ppid_and_name(pid: int) -> tuple[int, str] | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    return int(stat[stat.rindex(")") + 2 :].split()[1]), name


def rss_bytes(pid: int) -> int:
    """Resident set size of one process (0 if it is gone)."""
    try:
        statm = (PROC / str(pid) / "statm").read_text(encoding="utf-8").split()
    except OSError:
        return 0
    return int(statm[1]) * os.sysconf("SC_PAGE_SIZE")


def tree(root: int) -> dict[int, str]:
    """{pid: command name} of `root` and every descendant still alive."""
    parents: dict[int, list[tuple[int, str]]] = {}
    names: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        info = _ppid_and_name(int(entry.name))
        if info is not None:
            parents.setdefault(info[0], []).append((int(entry.name), info[1]))
            names[int(entry.name)] = info[1]
    found = {root: names.get(root, "?")}
    todo = [root]
    while todo:
        for child, name in parents.get(todo.pop(), []):
            found[child] = name
            todo.append(child)
    return found


@dataclass(slots=True)
class Peak:
    """Peaks of one window, bytes."""

    tree: int = 0
    per_process: dict[str, int] = field(default_factory=dict)  # "name[pid]" -> peak

    @property
    def largest_process(self) -> int:
        return max(self.per_process.values(), default=0)


class TreeSampler:
    """Samples the RSS of `root`'s process tree on a thread until `stop()`."""

    def __init__(self, root: int, interval_s: float = 0.2) -> None:
        self._root = root
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._peak = Peak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def sample(self) -> None:
        sizes = {f"{name}[{pid}]": rss_bytes(pid) for pid, name in tree(self._root).items()}
        with self._lock:
            self._peak.tree = max(self._peak.tree, sum(sizes.values()))
            for key, size in sizes.items():
                self._peak.per_process[key] = max(self._peak.per_process.get(key, 0), size)

    def reset(self) -> Peak:
        """The peaks so far; starts a new window."""
        self.sample()
        with self._lock:
            peak, self._peak = self._peak, Peak()
        return peak

    def stop(self) -> Peak:
        self._stop.set()
        self._thread.join()
        return self.reset()
