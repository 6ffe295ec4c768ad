"""The KV channel's API side (engine/ticket_slots.py): its bound, its blocked tickets, the
ring of recycled files and the sweep, over real files in a temporary folder."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from inferflux.config.disagg_settings import DisaggregatedSettings
from inferflux.engine.messages import KvTicket
from inferflux.engine.ticket_slots import TicketSlots


@pytest.fixture
def settings(tmp_path) -> DisaggregatedSettings:
    return DisaggregatedSettings(path=str(tmp_path), channel_capacity=2, ticket_wait_s=0.2)


@pytest.fixture
def slots(settings: DisaggregatedSettings):
    made = TicketSlots(lambda: settings)
    made.open()
    yield made
    made.close()


def _write(path: str, size: int) -> KvTicket:
    with open(path, "wb") as f:
        f.write(b"k" * size)
    return KvTicket(path=path, n_tokens=size // 100, nbytes=size)


async def test_tickets_are_private_files_named_apart(slots, tmp_path) -> None:
    first, second = await slots.reserve(10), await slots.reserve(10)
    assert first != second and os.path.dirname(first) == slots.folder
    assert os.path.dirname(slots.folder) == str(tmp_path)
    assert oct(os.stat(slots.folder).st_mode & 0o777) == "0o700"
    assert slots.stats().in_flight == 2


async def test_a_full_channel_blocks_past_the_wait_and_counts_it(slots) -> None:
    await slots.reserve(10)
    await slots.reserve(10)
    started = time.monotonic()
    assert await slots.reserve(10) is None
    assert time.monotonic() - started >= 0.19
    assert slots.stats().blocked == 1


async def test_a_released_slot_wakes_a_waiting_request(slots) -> None:
    first = await slots.reserve(10)
    await slots.reserve(10)
    waiting = asyncio.create_task(slots.reserve(10))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    slots.release(first)
    assert await waiting is not None
    assert slots.stats().blocked == 0


async def test_the_byte_bound_learns_from_written_tickets(settings, slots) -> None:
    settings.channel_capacity = 100
    settings.channel_max_mb = 1
    path = await slots.reserve(100)
    _write(path, 600_000)
    slots.written(path, KvTicket(path=path, n_tokens=100, nbytes=600_000))  # 6 kB a token
    assert slots.stats().in_flight_bytes == 600_000
    # 100 more tokens: about 600 kB more, past 1 MiB with the first: waits, then blocked
    assert await slots.reserve(100) is None
    slots.release(path)
    assert await slots.reserve(100) is not None  # one ticket always fits


async def test_release_deletes_the_file_and_is_idempotent(slots) -> None:
    path = await slots.reserve(10)
    _write(path, 100)
    slots.release(path)
    slots.release(path)
    assert not os.path.exists(path)
    assert slots.stats().in_flight == 0


async def test_a_recycled_file_is_taken_over_by_the_next_ticket(slots) -> None:
    path = await slots.reserve(10)
    _write(path, 5000)
    slots.release(path, recycle=True)
    assert not os.path.exists(path)  # renamed aside, never reused under its old name
    kept = os.listdir(slots.folder)
    assert len(kept) == 1
    following = await slots.reserve(10)
    assert os.path.getsize(following) == 5000  # the same pages, under a fresh name
    assert os.listdir(slots.folder) == [os.path.basename(following)]


async def test_the_ring_keeps_at_most_capacity_files_and_max_bytes(settings, slots) -> None:
    paths = [await slots.reserve(10), await slots.reserve(10)]
    for path in paths:
        _write(path, 1000)
    settings.channel_capacity = 1
    for path in paths:
        slots.release(path, recycle=True)
    assert len(os.listdir(slots.folder)) == 1  # the second one was deleted
    settings.channel_capacity, settings.channel_max_mb = 4, 1
    big = await slots.reserve(10)  # takes the recycled one over
    _write(big, 2 * 1024 * 1024)
    slots.release(big, recycle=True)
    assert os.listdir(slots.folder) == []  # larger than channel_max_mb: deleted


async def test_the_sweep_removes_only_old_orphans(slots) -> None:
    live = await slots.reserve(10)
    _write(live, 10)
    recycled = await slots.reserve(10)
    _write(recycled, 10)
    slots.release(recycled, recycle=True)
    orphan = os.path.join(slots.folder, "t999")  # a late writer's file after a kill -9
    _write(orphan, 10)
    fresh = os.path.join(slots.folder, "t998")
    _write(fresh, 10)
    old = time.time() - 60
    for name in os.listdir(slots.folder):
        if name != "t998":
            os.utime(os.path.join(slots.folder, name), (old, old))
    assert slots.sweep() == 1
    names = os.listdir(slots.folder)
    assert not os.path.exists(orphan) and os.path.exists(live) and os.path.exists(fresh)
    assert sum(name.startswith("free") for name in names) == 1  # the ring is not swept


async def test_close_removes_the_folder(settings) -> None:
    slots = TicketSlots(lambda: settings)
    slots.open()
    path = await slots.reserve(10)
    _write(path, 10)
    slots.close()
    assert not os.path.exists(slots.folder)


def test_a_missing_base_folder_falls_back_to_the_temp_dir(tmp_path) -> None:
    settings = DisaggregatedSettings(path=str(tmp_path / "absent"))
    slots = TicketSlots(lambda: settings)
    slots.open()
    try:
        assert os.path.isdir(slots.folder)
    finally:
        slots.close()


async def test_a_request_cancelled_while_waiting_for_the_channel_holds_nothing(slots) -> None:
    await slots.reserve(10)
    await slots.reserve(10)
    waiting = asyncio.create_task(slots.reserve(10))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert slots.stats().in_flight == 2 and slots.stats().blocked == 0


def test_opening_removes_the_folders_of_servers_that_are_gone(settings, tmp_path) -> None:
    dead = tmp_path / "inferflux-kv-999999999-abc"  # no such pid
    dead.mkdir()
    (dead / "free1").write_bytes(b"x" * 100)
    alive = tmp_path / f"inferflux-kv-{os.getpid()}-def"
    alive.mkdir()
    other = tmp_path / "unrelated"
    other.mkdir()
    slots = TicketSlots(lambda: settings)
    slots.open()
    try:
        assert not dead.exists() and alive.exists() and other.exists()
    finally:
        slots.close()
