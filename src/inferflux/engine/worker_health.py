"""Hang detection for one engine worker: when to ping it, and when it counts as hung.

Owns the bookkeeping (`WorkerHealth`) and the rule. Does not own taking the worker out
of rotation, killing or replacing it (engine/client.py does that on `hung()`).

The rule: the API's watchdog sends a `Ping` at every tick (0.2 s) while none is
outstanding, and every message from the worker (a step's outputs, an embedding, a `Pong`)
is a sign of life. A worker with a ping outstanding and nothing heard from it for
`runtime.worker_hang_timeout_s` is hung. The worker answers pings between engine steps, on
the thread that runs them, so one rule covers both cases: a worker that holds work and
makes no step progress, and an idle worker that stops answering. Detection takes at most
the deadline plus two ticks. The deadline must exceed the longest step a healthy worker
takes (a `scheduler.max_batch_tokens` prompt chunk, an embedding pass): about 1 s for
SmolLM2-135M on 2 shared cores, several seconds for a large model on CPU.

A worker still loading its model is not pinged (`runtime.worker_start_timeout_s` bounds
that); a new worker becomes ready only once it reported `WorkerReady` and answered a ping.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class WorkerHealth:
    """One worker's liveness, as the API process's event loop sees it (not thread-safe).
    `hangs` counts the hangs of this worker slot over its replacements."""

    heard_at: float = 0.0  # time.monotonic() of the latest message from the worker
    ping_seq: int = 0  # the latest ping's sequence number
    ping_sent_at: float | None = None  # when the outstanding ping was sent; None: none is
    hangs: int = 0

    def reset(self, now: float) -> None:
        """A fresh worker process (or thread): nothing outstanding, heard from now."""
        self.heard_at = now
        self.ping_sent_at = None

    def heard(self, now: float) -> None:
        """Any message from the worker."""
        self.heard_at = now

    def answered(self, seq: int, now: float) -> bool:
        """A `Pong(seq)`: True when it answers the outstanding ping (an older one only
        counts as a sign of life)."""
        self.heard_at = now
        if self.ping_sent_at is not None and seq == self.ping_seq:
            self.ping_sent_at = None
            return True
        return False

    def next_ping(self, now: float) -> int | None:
        """The sequence number of a ping to send now, or None while one is outstanding."""
        if self.ping_sent_at is not None:
            return None
        self.ping_seq += 1
        self.ping_sent_at = now
        return self.ping_seq

    def hung(self, now: float, timeout_s: float) -> bool:
        """True when a ping has waited `timeout_s` and nothing was heard for as long."""
        if self.ping_sent_at is None:
            return False
        return now - self.ping_sent_at > timeout_s and now - self.heard_at > timeout_s
