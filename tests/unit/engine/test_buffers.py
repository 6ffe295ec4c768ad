"""`in_place`: a uint8* into any Python buffer, no copy (engine/backends/buffers.py)."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from inferflux.engine.backends.buffers import in_place


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "mmap"])
def test_the_pointer_reads_the_buffers_own_bytes_from_the_offset(kind: str) -> None:
    raw = bytes(range(256)) * 4
    data: object
    if kind == "mmap":
        data = mmap.mmap(-1, len(raw))
        data.write(raw)
    else:
        data = {"bytes": raw, "bytearray": bytearray(raw), "memoryview": memoryview(raw)}[kind]
    pointer = in_place(data, 10)
    assert ctypes.string_at(pointer, 20) == raw[10:30]
    del pointer  # NOTE: a map with exported pointers cannot close
    if isinstance(data, mmap.mmap):
        data.close()


def test_writes_through_the_pointer_land_in_the_buffer_it_points_into() -> None:
    """What `LlamaCppBackend.save_seq` relies on: llama.cpp writes the state through the
    pointer into a numpy buffer's memoryview, which is then cut to the bytes written."""
    data = np.zeros(8, np.uint8).data
    pointer = in_place(data)
    ctypes.memmove(pointer, b"\x01\x02\x03", 3)
    assert bytes(data[:3]) == b"\x01\x02\x03" and bytes(data[3:]) == bytes(5)
