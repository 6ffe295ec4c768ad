"""The KV channel of disaggregated prefill/decode, worker side: writing a hand-off ticket
(prefill) and hydrating one into a sequence (decode). DESIGN.md §6.

Owns: the ticket file format on shared memory (a `kv_state` blob whose crc field is 0,
`kv_state.ticket_head`), the model fingerprint tickets carry, and the counters of one
worker's tickets. Does not own: naming ticket files or their lifetime (the API process:
engine/ticket_slots.py), when a ticket is written or hydrated (engine/core.py and the
scheduler's `KvHydrate`), nor llama.cpp calls (the backend's `save_seq_into` / `load_seq`).

The transport is a file on tmpfs (`/dev/shm`), mapped by both processes: the prefill
worker sizes it and llama.cpp writes the sequence state straight into the map
(`llama_state_seq_get_data`), the decode worker maps it and llama.cpp reads from the map
(`llama_state_seq_set_data`). One copy on each side, no socket, no pickling, nothing
through the API process but the ticket's name. Python's `multiprocessing.shared_memory`
is the same mechanism (shm_open is a file in /dev/shm) but registers every segment with a
resource tracker that unlinks it when the creating process exits, which is exactly when a
ticket must outlive its writer.

The files are recycled (a ring, engine/ticket_slots.py): a ticket is written over the
pages of an earlier one, which may be larger than it (`KvTicket.nbytes` says where it
ends). Fresh tmpfs pages cost more than the copy itself: 23.6 MB of SmolLM2 KV (1,024
tokens) took 18 ms to write into a new file and 1 ms into one already written
(bench/kv_transfer.py). Neither worker deletes a ticket: the API process does, or
recycles it once both sides are provably done with it.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

from inferflux.engine.backends.llama_cpp import WritableBuffer
from inferflux.engine.kv_state import (
    PREFIX_SIZE,
    BlobHeader,
    KvStateRefused,
    Layout,
    check_ticket,
    header_end,
    ticket_head,
)
from inferflux.engine.messages import KvTicket, TicketStats

logger = logging.getLogger(__name__)

# NOTE: MAP_POPULATE maps every page in one call: a recycled file's pages are then not
# faulted in one by one (about 5,800 minor faults for 1,024 SmolLM2 tokens, most of the
# copy's time). Linux only, hence the getattr.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class TicketBackend(Protocol):
    """The backend calls a ticket needs (LlamaCppBackend has them)."""

    def seq_state_size(self, seq_id: int) -> int: ...

    def save_seq_into(self, seq_id: int, buffer: WritableBuffer, offset: int, size: int) -> int: ...

    def load_seq(
        self, seq_id: int, data: bytes | WritableBuffer, n_tokens: int, offset: int = 0
    ) -> bool: ...

    def kv_layout(self) -> Layout: ...


def ticket_model_id(
    model_path: str, sha256: str, adapters: tuple[tuple[str, str, float], ...]
) -> str:
    """What a ticket's header names the model by: its SHA-256 when the config gives one,
    else the file's real path, size and modification time (both pools run on one node and
    read the same file; hashing gigabytes at every worker start would cost more than it
    checks). LoRA adapters (path, sha256, scale) are part of it."""
    parts = [sha256 or _file_key(model_path)]
    parts += [f"{digest or _file_key(path)}@{scale}" for path, digest, scale in adapters]
    return "|".join(parts)


def _file_key(path: str) -> str:
    stat = os.stat(path)
    return f"file:{os.path.realpath(path)}:{stat.st_size}:{stat.st_mtime_ns}"


@dataclass(slots=True)
class TicketRecorder:
    """One worker's tickets: the counters it reports (`EngineStats.tickets`) and the
    transfers since its previous message (`StepStats.transfer_s`, trace spans)."""

    stats: TicketStats = field(default_factory=TicketStats)
    # (request id, enqueued time.time_ns(), hydrated time.time_ns(), bytes) not taken yet
    transfers: list[tuple[str, int, int, int]] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)

    def take_transfer_s(self) -> list[float]:
        taken, self.transfer_s = self.transfer_s, []
        return taken

    def take_transfers(self) -> list[tuple[str, int, int, int]]:
        taken, self.transfers = self.transfers, []
        return taken


class KvChannelEnd:
    """A worker's end of the channel: `write` (prefill) or `hydrate` (decode)."""

    def __init__(self, backend: TicketBackend, model_id: str) -> None:
        self.backend = backend
        self.model_id = model_id
        self.layout = backend.kv_layout()
        self.recorder = TicketRecorder()

    def write(self, path: str, seq_id: int, token_ids: list[int], namespace: str) -> KvTicket:
        """Write the KV of `seq_id` (covering `token_ids`) to the file at `path` (a recycled
        one, or a new one). Raises OSError when it cannot (tmpfs full): the API process
        deletes what is left."""
        started = time.perf_counter()
        header = BlobHeader(
            model_id=self.model_id,
            layout=self.layout,
            namespace=namespace,
            token_ids=token_ids,
            created_at=time.time(),
        )
        size = self.backend.seq_state_size(seq_id)
        head = ticket_head(header)
        total = len(head) + size
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # NOTE: allocate before mapping. A write through a map into a full tmpfs is
            # SIGBUS, which would kill the worker; fallocate says ENOSPC instead (a
            # container's /dev/shm is 64 MB by default). A no-op on a recycled file.
            os.posix_fallocate(fd, 0, total)
            with mmap.mmap(fd, total, flags=_MAP_FLAGS) as mapped:
                mapped[: len(head)] = head
                written = self.backend.save_seq_into(seq_id, mapped, len(head), size)
            if written <= 0:
                raise OSError("llama.cpp wrote no sequence state")
        finally:
            os.close(fd)
        write_s = time.perf_counter() - started
        stats = self.recorder.stats
        stats.written += 1
        stats.write_seconds_total += write_s
        stats.written_bytes += len(head) + written
        return KvTicket(
            path=path,
            n_tokens=len(token_ids),
            nbytes=len(head) + written,
            enqueued_at=time.monotonic(),
            enqueued_ns=time.time_ns(),
            write_s=write_s,
        )

    def hydrate(
        self, request_id: str, ticket: KvTicket, seq_id: int, token_ids: list[int], namespace: str
    ) -> bool:
        """Load `ticket` into `seq_id`. False (logged, counted, `seq_id` empty) when it is
        refused: gone, written for another model, layout, namespace or tokens, or not
        loadable. The caller then computes the prompt itself. The file stays: the API
        process recycles or deletes it."""
        started = time.perf_counter()
        try:
            self._load(ticket, seq_id, token_ids, namespace)
        except KvStateRefused as exc:
            logger.warning("KV ticket of %s refused: %s; computing its prompt", request_id, exc)
            self.recorder.stats.refused += 1
            return False
        stats = self.recorder.stats
        stats.hydrated += 1
        stats.hydrate_seconds_total += time.perf_counter() - started
        recorder = self.recorder
        recorder.transfer_s.append(max(0.0, time.monotonic() - ticket.enqueued_at))
        recorder.transfers.append((request_id, ticket.enqueued_ns, time.time_ns(), ticket.nbytes))
        return True

    def _load(self, ticket: KvTicket, seq_id: int, token_ids: list[int], namespace: str) -> None:
        try:
            fd = os.open(ticket.path, os.O_RDWR)
        except OSError as exc:
            raise KvStateRefused(f"the ticket is gone ({exc.strerror})") from None
        try:
            total = ticket.nbytes  # the file may be longer: a recycled one
            if os.fstat(fd).st_size < total or total < PREFIX_SIZE:
                raise KvStateRefused(f"truncated: {os.fstat(fd).st_size} bytes")
            mapped = mmap.mmap(fd, total, flags=_MAP_FLAGS)
        finally:
            os.close(fd)
        with mapped:
            end = header_end(mapped[:PREFIX_SIZE])
            if end > total:
                raise KvStateRefused("truncated header")
            header = check_ticket(
                mapped[:end], total - end, model_id=self.model_id, layout=self.layout
            )
            if header.token_ids != token_ids or header.namespace != namespace:
                raise KvStateRefused("the ticket covers other tokens than the request's prompt")
            if not self.backend.load_seq(seq_id, mapped, len(token_ids), offset=end):
                raise KvStateRefused("llama.cpp did not load the sequence state")


class Handoffs:
    """The tickets of one worker's requests in disaggregated mode: where each prefill
    request's ticket goes, and which ticket each decode request hydrates. EngineCore's
    collaborator (one thread)."""

    def __init__(self, end: KvChannelEnd) -> None:
        self.end = end
        self._out: dict[str, str] = {}  # prefill: request id → ticket path
        self._in: dict[str, KvTicket] = {}  # decode: request id → ticket to hydrate

    def sends(self, request_id: str) -> bool:
        """True for a prefill request that ends in a ticket (it samples nothing)."""
        return request_id in self._out

    def expect_out(self, request_id: str, path: str) -> None:
        self._out[request_id] = path

    def expect_in(self, request_id: str, ticket: KvTicket) -> None:
        self._in[request_id] = ticket

    def write(
        self, request_id: str, seq_id: int, token_ids: list[int], namespace: str
    ) -> KvTicket | None:
        """Write the request's ticket; None (logged) when it cannot be written."""
        path = self._out.pop(request_id)
        try:
            return self.end.write(path, seq_id, token_ids, namespace)
        except OSError as exc:
            logger.warning("cannot write the KV ticket of %s: %s", request_id, exc)
            return None

    def hydrate(
        self, request_id: str, seq_id: int, token_ids: list[int], namespace: str
    ) -> KvTicket | None:
        """Load the request's ticket into `seq_id`: the ticket, or None when refused."""
        ticket = self._in.pop(request_id, None)
        if ticket is None or not self.end.hydrate(request_id, ticket, seq_id, token_ids, namespace):
            return None
        return ticket

    def drop(self, request_id: str) -> None:
        """A request ended before its ticket was written or hydrated (the API process
        deletes the file)."""
        self._out.pop(request_id, None)
        self._in.pop(request_id, None)
