"""The prefix cache's disk tier (`runtime.nvme_offload.path`) on a small tmpfs, under 16
streams of multi-turn chats: the filesystem filled (and kept full), then remounted
read-only. Blob writes fail; the promise (docs/kv-cache.md): requests keep succeeding
(recomputed instead of restored), each failed write is counted in
`inferflux_kv_disk_write_errors_total` and its entry dropped from the index, the log
gets one line per run of failures (not one per write), nothing half-written is left
behind to be read back, and writes succeed again once space (or rw) returns. Part of
the "disk" group (disk_faults.py calls `kv_disk_faults`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, StreamLoad, send_one, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving, stats, wait_until

SIZE_MB = 48
FAILING = "KV disk tier: writes to"
RECOVERED = "succeed again"
# Each conversation opens with a long message of its own, so a later turn's prefix is
# worth restoring from disk rather than recomputing (kv_offload.py's restore rule).
_OPENING = (
    "You are the archivist of conversation {n}. Keep these notes in mind: the river "
    "floods in spring, the mill stands on the east bank, the bridge was rebuilt twice, "
    "the market opens at dawn on Saturdays, and the lighthouse keeper writes letters to "
    "the town council about the fog. Now tell me about day {n}."
)
ENV = {
    "INFERFLUX_KV_CPU_PAGES": "0",  # evicted entries go straight to the disk tier
    "INFERFLUX_SCHEDULER__PREFIX_CACHE__SLOTS": "2",  # few slots: entries spill constantly
    "INFERFLUX_RUNTIME__NVME_OFFLOAD__MAX_BYTES": str((SIZE_MB - 8) * 1024 * 1024),
    "INFERFLUX_RUNTIME__KV_PERSISTENCE__ENABLED": "true",
    "INFERFLUX_RUNTIME__KV_PERSISTENCE__SNAPSHOT_INTERVAL_S": "2",  # manifest writes fail too
}


class MultiTurnLoad(StreamLoad):
    """Each client holds a conversation of up to 4 turns (then starts another), so later
    turns share long prefixes with entries spilled to disk."""

    async def _client(self, client: httpx.AsyncClient) -> None:
        messages: list[dict[str, str]] = []
        while not self._stopping.is_set():
            self._counter += 1
            if len(messages) >= 7:
                messages = []
            if messages:
                messages += [{"role": "assistant", "content": "Noted."}]
            text = _OPENING.format(n=self._counter) if not messages else "Go on."
            messages += [{"role": "user", "content": text}]
            spec = dataclasses.replace(self.spec, body={"messages": list(messages)})
            self.outcomes.append(await send_one(client, spec, self._counter))
            await asyncio.sleep(0)


@contextlib.contextmanager
def _tmpfs() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="inferflux-chaos-kv-"))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(folder)], check=True
    )
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


class _Filler:
    """Keeps `folder`'s filesystem full while running: appends zeros to `folder/filler`
    every 0.2 s, taking the space the tier's own deletions free."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "filler"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-filler", daemon=True)

    def __enter__(self) -> _Filler:
        self._top_up()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.path.unlink()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._top_up()

    def _top_up(self) -> None:
        fill_until_full(self.path)


def fill_until_full(path: Path) -> None:
    """Append zeros to `path` (created if missing) until its filesystem is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


def _tiers(url: str) -> dict[str, int]:
    return dict(stats(url).get("kv_tiers") or {})


def _leftovers(folder: Path) -> int:
    """Temp files of blob or manifest writes left in the folder (must be none)."""
    return sum(1 for p in folder.rglob("*") if ".tmp" in p.name)


def _phase(result: FaultResult, url: str, folder: Path, run: ChaosRun, what: str) -> None:
    """Load under the fault: every request ok, write errors counted, nothing left half
    written."""
    before = _tiers(url)
    spec = LoadSpec(streams=run.streams, max_tokens=8)
    load = MultiTurnLoad(url, spec).start()
    time.sleep(run.seconds(15))
    counts = tally(load.stop())
    after = _tiers(url)
    result.count(counts)
    errors = after["write_errors"] - before["write_errors"]
    result.notes.append(
        f"{what}: load {counts.ok} ok of {counts.sent}; {errors} failed writes counted; "
        f"spills {after['spills'] - before['spills']}, restores "
        f"{after['restores'] - before['restores']}, refusals "
        f"{after['refusals'] - before['refusals']}; disk tier {after['disk_entries']} entries"
    )
    result.check(counts.ok == counts.sent and counts.sent > 0, f"{what}: every request ok")
    result.check(errors > 0, f"{what}: failed writes counted")
    result.check(_leftovers(folder) == 0, f"{what}: no half-written file left")


def _written_since(folder: Path, since: float) -> bool:
    """A blob was completely written (renamed into place) after wall time `since`."""
    for path in folder.rglob("*.kv"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime >= since:
                return True
    return False


def _recover(result: FaultResult, url: str, folder: Path, run: ChaosRun) -> None:
    """Load again: a blob is written again, and requests keep succeeding."""
    since = time.time()
    spec = LoadSpec(streams=run.streams, max_tokens=8)
    load = MultiTurnLoad(url, spec).start()
    took = wait_until(lambda: _written_since(folder, since), 60)
    counts = tally(load.stop())
    result.count(counts)
    result.recovery_s = took
    result.check(took is not None, "disk writes succeed again")
    result.check(counts.ok == counts.sent, "every request ok after the fault")


def _warm(url: str, run: ChaosRun) -> dict[str, Any]:
    load = MultiTurnLoad(url, LoadSpec(streams=run.streams, max_tokens=8)).start()
    wait_until(lambda: _tiers(url).get("disk_entries", 0) > 0, 60)
    load.stop()
    return _tiers(url)


def kv_disk_faults(run: ChaosRun) -> list[FaultResult]:
    full = FaultResult(
        "disk full: KV spill dir (16 multi-turn streams)",
        target="0 failed, 0 lost; failed writes counted, entries dropped, one log line per "
        "run of failures; no half-written file; writes again ≤ 60 s after space returns",
        passed=True,
    )
    readonly = FaultResult(
        "disk read-only: KV spill dir (16 multi-turn streams)",
        target="as above; writes again after remount rw",
        passed=True,
    )
    with _tmpfs() as folder:
        env = {**ENV, "INFERFLUX_NVME_OFFLOAD_PATH": str(folder)}
        log = run.log_dir / "kv-disk.log"
        with serving(run.log_dir, "kv-disk", env=env) as server:
            warm = _warm(server.url, run)
            full.notes.append(f"before: {warm['spills']} spills, {warm['disk_entries']} on disk")
            started = time.monotonic()
            with _Filler(folder):
                _phase(full, server.url, folder, run, "full")
            _recover(full, server.url, folder, run)
            full.duration_s = time.monotonic() - started
            started = time.monotonic()
            remount = _remount(folder, "ro")
            readonly.notes.append(f"remount ro: {remount or 'ok'}")
            readonly.check(not remount, "remount read-only")
            _phase(readonly, server.url, folder, run, "read-only")
            _remount(folder, "rw")
            _recover(readonly, server.url, folder, run)
            readonly.duration_s = time.monotonic() - started
        text = log.read_text(errors="replace")
        failing_lines = text.count(FAILING) - text.count(RECOVERED)
        for result in (full, readonly):
            result.notes.append(f"server log: {failing_lines} 'writes fail' lines in all")
            result.check(failing_lines <= 4, "failures logged once per run, not per write")
            result.check("Traceback" not in text, "no traceback")
    return [full, readonly]


def _remount(folder: Path, mode: str) -> str:
    """Remount `folder` `mode` (ro/rw), retrying while busy (a blob write in flight);
    '' when done, else the error."""
    error = ""
    for _ in range(50):
        done = subprocess.run(
            ["mount", "-o", f"remount,{mode}", str(folder)],
            check=False,
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            return ""
        error = done.stderr.strip()
        time.sleep(0.1)
    return error
