"""`TicketSlots`: the KV channel of disaggregated prefill/decode, API side (a bounded
set of hand-off tickets in shared memory).

Owns: the private folder of ticket files (under `scheduler.disaggregated.path`, /dev/shm
by default), naming each ticket, the channel's bound (`channel_capacity` tickets and
`channel_max_mb` bytes in flight: a request waits for room before its prefill starts, up
to `ticket_wait_s`, and is then counted blocked), deleting every ticket once its request
is past it (whatever happened: hydrated, refused, cancelled, a worker killed), the ring
of recycled files, sweeping files no live ticket names, and the channel's counters.

Recycling: a fresh tmpfs page costs more than copying KV into it (engine/kv_channel.py),
so a ticket file is renamed aside once both workers are provably done with it (its
decode worker sent the request's first delta: it hydrated or refused the ticket before
that step, and the prefill worker finished writing before it reported HANDOFF), and the
next reservation takes it over by renaming it to its own fresh name. A ticket whose fate
is unknown (cancelled during prefill, a worker killed) is deleted, never recycled: a late
writer can then only create an orphan under a name nobody reads (swept), never write
into another request's ticket. At most `channel_capacity` files and `channel_max_mb`
bytes are kept for reuse. Does not own: writing or reading
a ticket (the workers: engine/kv_channel.py) or the request flow (engine/client.py).

The API process names every ticket and deletes it, so a ticket outlives neither its
request nor the server, even when the worker that wrote it or was to read it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from inferflux.config.disagg_settings import DisaggregatedSettings
from inferflux.engine.messages import KvTicket
from inferflux.engine.protocol import ChannelStats

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
_SWEEP_AGE_S = 10.0  # a file no live ticket names, this old, is an orphan
_PREFIX = "inferflux-kv-"  # + the API process's pid: its folder of tickets


@dataclass(slots=True)
class ChannelCounters:
    handed_off: int = 0
    blocked: int = 0
    direct: int = 0
    resubmitted: int = 0


class TicketSlots:
    """The channel's tickets (see the module docstring). Event loop only."""

    def __init__(self, settings: Callable[[], DisaggregatedSettings]) -> None:
        self._settings = settings  # read per request: the live config applies at once
        self._dir = ""
        self._names = itertools.count()
        self._in_flight: dict[str, int] = {}  # ticket path → its estimated bytes
        self._free: list[tuple[str, int]] = []  # recycled files: (path, size)
        self._freed = asyncio.Event()
        self._bytes_per_token = 0.0  # learned from the tickets written (0 = not yet)
        self.counters = ChannelCounters()
        self.prefill_queue = 0  # requests in the prefill pool now (engine/client.py)

    @property
    def folder(self) -> str:
        return self._dir

    def open(self) -> None:
        """Make the private ticket folder (mode 0700)."""
        base = self._settings().path
        if not os.path.isdir(base):
            logger.warning("%s does not exist: KV tickets go to %s", base, tempfile.gettempdir())
            base = tempfile.gettempdir()
        _remove_dead_folders(base)
        self._dir = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)

    def close(self) -> None:
        """Delete every ticket and the folder (the workers are stopped)."""
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._in_flight.clear()
        self._free.clear()

    async def reserve(self, n_tokens: int) -> str | None:
        """A ticket path for a prompt of `n_tokens` once the channel has room for it, or
        None (counted blocked) if it has none within `ticket_wait_s`."""
        settings = self._settings()
        estimate = int(self._bytes_per_token * n_tokens)
        deadline = time.monotonic() + settings.ticket_wait_s
        while not self._has_room(estimate, settings):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.counters.blocked += 1
                return None
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), remaining)
        path = os.path.join(self._dir, f"t{next(self._names)}")
        if self._free:  # the most recently used file: its pages are warm
            recycled, _ = self._free.pop()
            with contextlib.suppress(OSError):  # gone: the worker makes a new one
                os.rename(recycled, path)
        self._in_flight[path] = estimate
        return path

    def _has_room(self, estimate: int, settings: DisaggregatedSettings) -> bool:
        if not self._in_flight:
            return True  # one ticket always fits, however large
        if len(self._in_flight) >= settings.channel_capacity:
            return False
        return sum(self._in_flight.values()) + estimate <= settings.channel_max_mb * MIB

    def written(self, path: str, ticket: KvTicket) -> None:
        """A prefill worker wrote `ticket`: its real size replaces the estimate."""
        if path in self._in_flight:
            self._in_flight[path] = ticket.nbytes
        if ticket.n_tokens:
            per_token = ticket.nbytes / ticket.n_tokens
            self._bytes_per_token = max(self._bytes_per_token * 0.9, per_token)

    def release(self, path: str, *, recycle: bool = False) -> None:
        """The request is past its ticket: free the slot and delete the file, or with
        `recycle` (both workers are done with it: see the module docstring) keep it for
        a next ticket if the ring has room. Idempotent."""
        if self._in_flight.pop(path, None) is None:
            return
        self._freed.set()
        if recycle and self._keep(path):
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def _keep(self, path: str) -> bool:
        settings = self._settings()
        try:
            size = os.stat(path).st_size
        except OSError:
            return False
        kept = sum(size for _, size in self._free)
        if (
            len(self._free) >= settings.channel_capacity
            or kept + size > settings.channel_max_mb * MIB
        ):
            return False
        recycled = os.path.join(self._dir, f"free{next(self._names)}")
        try:
            os.rename(path, recycled)
        except OSError:
            return False
        self._free.append((recycled, size))
        return True

    def sweep(self) -> int:
        """Delete files of the folder that no ticket in flight names (a worker that was
        killed between writing a file and the API deleting it); returns how many."""
        if not self._dir:
            return 0
        removed = 0
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(self._dir) as entries:
            for entry in entries:
                if entry.path in self._in_flight or entry.name.startswith("free"):
                    continue
                with contextlib.suppress(OSError):
                    if now - entry.stat().st_mtime > _SWEEP_AGE_S:
                        os.unlink(entry.path)
                        removed += 1
        return removed

    def stats(self) -> ChannelStats:
        c = self.counters
        return ChannelStats(
            capacity=self._settings().channel_capacity,
            in_flight=len(self._in_flight),
            in_flight_bytes=sum(self._in_flight.values()),
            prefill_queue=self.prefill_queue,
            handed_off=c.handed_off,
            blocked=c.blocked,
            direct=c.direct,
            resubmitted=c.resubmitted,
        )


def _remove_dead_folders(base: str) -> None:
    """Remove the ticket folders of API processes that are gone (killed with SIGKILL, so
    they could not): tmpfs is memory, and their recycled files would hold it for good."""
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        for entry in entries:
            if not entry.name.startswith(_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            pid = entry.name[len(_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)) and entry.stat().st_uid == os.getuid():
                logger.warning("removing the KV tickets of a server that is gone: %s", entry.path)
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
