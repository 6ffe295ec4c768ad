"""A sequence's KV as versioned bytes: the one primitive behind the host and disk cache
tiers and restart persistence, and the prefill → decode hand-off tickets (DESIGN.md §6).

Owns: the blob format and its checks. Does not own: getting the bytes out of llama.cpp
(`LlamaCppBackend.save_seq` / `load_seq`), where blobs are kept (kv_tiers.py), or when to
restore one (kv_offload.py).

Format (little endian)::

    b"IFKV" | version u16 | header length u32 | crc32 u32 | header (msgpack) | payload

The header names the model (`model_id`: the GGUF's SHA-256, plus its LoRA adapters'),
the context layout the bytes were written for (`layout`: n_ctx per sequence, KV types,
SWA settings, layer count, unified KV), the cache namespace and the token ids the KV
covers. The crc32 covers header and payload. `decode_blob` refuses bytes of another
format version, another model, another layout, a mismatched token count or a bad
checksum with `KvStateRefused` (its message says which); the caller logs it and
recomputes. It never hands llama.cpp bytes it has not checked.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import msgspec

MAGIC = b"IFKV"
VERSION = 1
_PREFIX = struct.Struct("<4sHII")  # magic, version, header length, crc32
PREFIX_SIZE = _PREFIX.size

Layout = dict[str, int | bool | str]
Blob = bytes | memoryview  # a blob's bytes, or a view of them


class KvStateRefused(Exception):
    """Bytes that must not be loaded: the message says why (logged, then recompute)."""


class BlobHeader(msgspec.Struct, frozen=True, kw_only=True):
    """What a KV blob covers and what it was written for."""

    model_id: str
    layout: Layout
    namespace: str
    token_ids: list[int]
    created_at: float = 0.0  # time.time() when serialized


@dataclass(frozen=True, slots=True)
class KvBlob:
    """A checked blob: its header and the llama.cpp sequence state bytes."""

    header: BlobHeader
    payload: Blob  # a view into the blob (a copy of tens of MB cost 10 ms and more)

    @property
    def num_tokens(self) -> int:
        return len(self.header.token_ids)


def encode_blob(header: BlobHeader, payload: Blob) -> bytes:
    """The blob bytes of `payload` (from `llama_state_seq_get_data`) under `header`.
    NOTE: built with `b"".join`, not in a numpy buffer: numpy's were faster at the median
    but its huge-page allocations stalled some saves for 70-160 ms (bench/kv_tiers.py's
    cost part and an interleaved test, BENCHMARKS.md, eighteenth session)."""
    head = msgspec.msgpack.encode(header)
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"".join((_PREFIX.pack(MAGIC, VERSION, len(head), crc), head, payload))


def header_end(prefix: bytes) -> int:
    """How many leading bytes of a blob hold its header, from its first PREFIX_SIZE."""
    if len(prefix) < PREFIX_SIZE:
        raise KvStateRefused(f"truncated: {len(prefix)} bytes")
    return PREFIX_SIZE + int(_PREFIX.unpack_from(prefix)[2])


def read_header(data: bytes | memoryview) -> BlobHeader:
    """The header of a blob without checking the payload (index rebuild at start-up).
    Raises KvStateRefused when the bytes are not a blob of this version."""
    head, _, _ = _split(data)
    return _decode_header(head)


def decode_blob(data: Blob, *, model_id: str, layout: Layout) -> KvBlob:
    """Check `data` against this model and layout and split it. Raises KvStateRefused
    (not another error) for anything wrong with it."""
    head, payload, crc = _split(data)
    if zlib.crc32(payload, zlib.crc32(head)) != crc:
        raise KvStateRefused("checksum mismatch: the bytes are corrupt")
    header = _decode_header(head)
    _check_fingerprint(header, model_id, layout)
    if not payload:
        raise KvStateRefused("empty sequence state")
    return KvBlob(header=header, payload=payload)


def ticket_head(header: BlobHeader) -> bytes:
    """The leading bytes of a hand-off ticket (engine/kv_channel.py): llama.cpp writes the
    sequence state right after them, in shared memory.

    NOTE: a ticket's crc32 field is 0: it is never checked. The bytes go from one process's
    memory to another's through tmpfs on one node (no disk, no network to corrupt them),
    and a crc over a 4k-token sequence (~90 MB) costs more than the whole hand-off. The
    fingerprint (model, layout, tokens) is checked as for any blob (`check_ticket`)."""
    head = msgspec.msgpack.encode(header)
    return _PREFIX.pack(MAGIC, VERSION, len(head), 0) + head


def check_ticket(head: bytes, payload_size: int, *, model_id: str, layout: Layout) -> BlobHeader:
    """The header of a ticket whose first bytes (through its header: `header_end`) are
    `head`, after checking the format, model and layout (not a checksum: `ticket_head`).
    Raises KvStateRefused."""
    raw, _, _ = _split(head)
    header = _decode_header(raw)
    _check_fingerprint(header, model_id, layout)
    if payload_size <= 0:
        raise KvStateRefused("empty sequence state")
    return header


def _check_fingerprint(header: BlobHeader, model_id: str, layout: Layout) -> None:
    if header.model_id != model_id:
        raise KvStateRefused(
            f"written for model {header.model_id[:16]}…, this worker serves {model_id[:16]}…"
        )
    if header.layout != layout:
        changed = sorted(k for k in layout.keys() | header.layout.keys()
                         if layout.get(k) != header.layout.get(k))  # fmt: skip
        raise KvStateRefused(f"written for another KV layout (differs in {', '.join(changed)})")


def _split(data: bytes | memoryview) -> tuple[bytes, memoryview, int]:
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise KvStateRefused(f"truncated: {len(view)} bytes")
    magic, version, head_len, crc = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise KvStateRefused("not a KV blob (bad magic)")
    if version != VERSION:
        raise KvStateRefused(f"KV blob format version {version}, this build reads {VERSION}")
    end = _PREFIX.size + head_len
    if end > len(view):
        raise KvStateRefused("truncated header")
    return bytes(view[_PREFIX.size : end]), view[end:], crc


def _decode_header(head: bytes) -> BlobHeader:
    try:
        return msgspec.msgpack.decode(head, type=BlobHeader)
    except msgspec.DecodeError as exc:
        raise KvStateRefused(f"unreadable header: {exc}") from None
