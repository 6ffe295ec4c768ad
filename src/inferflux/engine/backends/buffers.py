"""Pointers into Python buffers for llama.cpp's state calls, without copying the bytes.

A sequence's KV state is tens of MB (2,048 SmolLM2 tokens: 47 MB). Moving it through
ctypes the obvious way (a zeroed `c_uint8` array copied out with `string_at`; bytes
copied in with `from_buffer_copy`) took 41 ms to save and 24 ms to load, where
`llama_state_seq_get_data` / `_set_data` themselves took 2.1 and 2.2 ms: each copy of
that size writes into fresh pages. Written in place, the save took 21 ms into a
`bytearray` and 7.9 ms into numpy's calloc'd memory (bench/kv_copy_cost.py --move,
BENCHMARKS.md, eighteenth session). A parked prefix's `KvMove` and every host-tier save
and restore pay it on an admission, in a request's TTFT.
"""

from __future__ import annotations

import ctypes
from typing import Any, cast

import numpy as np

_U8_P = ctypes.POINTER(ctypes.c_uint8)


def in_place(data: object, offset: int = 0) -> Any:
    """A `uint8*` to the bytes of `data` from `offset`: any buffer (bytes, bytearray,
    memoryview, a shared-memory map), read-only ones too. The pointer holds a reference
    to `data`'s buffer: drop it before resizing `data` or closing a map.
    Any: a ctypes pointer."""
    array = np.frombuffer(cast(Any, data), np.uint8, offset=offset)
    return array.ctypes.data_as(_U8_P)
