"""Hang detection for one engine worker: when to ping it, and when it counts as hung.

Owns the bookkeeping (`WorkerHealth`) and the rule. Does not own taking the worker out
of rotation, killing or replacing it (engine/pool_watchdog.py does that on `hang()`),
nor the worker's side (its heartbeat thread answers pings: engine/heartbeat.py).

The rule. The API's watchdog sends a `Ping` at every tick (0.2 s) while none is
outstanding, and every message from the worker (a step's outputs, an embedding, a `Pong`)
is a sign of life. A worker is hung when either:
- it is silent: a ping is outstanding and nothing was heard from it for
  `runtime.worker_hang_timeout_s` (a frozen process: SIGSTOP, a deadlock). Idle or busy,
  the heartbeat answers at once, so this takes at most the deadline plus two ticks;
- it is stuck: its latest `Pong` says its current engine step (or embedding pass) has run
  for more than `runtime.worker_step_timeout_s` (no step progress while it holds work: a
  `llama_decode` that never returns). A slow step on a busy CPU is not a hang until then.

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
    busy_s: float = 0.0  # the latest pong's: how long its current step had run
    hangs: int = 0

    def reset(self, now: float) -> None:
        """A fresh worker process (or thread): nothing outstanding, heard from now."""
        self.heard_at = now
        self.ping_sent_at = None
        self.busy_s = 0.0

    def heard(self, now: float) -> None:
        """Any message from the worker."""
        self.heard_at = now

    def answered(self, seq: int, busy_s: float, now: float) -> bool:
        """A `Pong(seq, busy_s)`: True when it answers the outstanding ping (an older one
        only counts as a sign of life)."""
        self.heard_at = now
        if self.ping_sent_at is not None and seq == self.ping_seq:
            self.ping_sent_at = None
            self.busy_s = busy_s
            return True
        return False

    def next_ping(self, now: float) -> int | None:
        """The sequence number of a ping to send now, or None while one is outstanding."""
        if self.ping_sent_at is not None:
            return None
        self.ping_seq += 1
        self.ping_sent_at = now
        return self.ping_seq

    def unsent(self) -> None:
        """The ping `next_ping` numbered could not be sent: none is outstanding."""
        self.ping_sent_at = None

    def hang(self, now: float, timeout_s: float, step_timeout_s: float) -> str | None:
        """Why the worker counts as hung now, or None. A deadline of 0 is off."""
        sent_at = self.ping_sent_at
        if timeout_s > 0 and sent_at is not None and now - max(self.heard_at, sent_at) > timeout_s:
            return (
                f"no answer to a health ping for {now - sent_at:.1f} s "
                "(runtime.worker_hang_timeout_s)"
            )
        if step_timeout_s > 0 and self.busy_s > step_timeout_s:
            return (
                f"one engine step has run for {self.busy_s:.1f} s (runtime.worker_step_timeout_s)"
            )
        return None
