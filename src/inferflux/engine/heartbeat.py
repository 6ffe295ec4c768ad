"""The worker's heartbeat: a thread that answers health pings while the engine thread may
be inside a long step.

Owns `StepClock` (what the engine thread is doing: when its current step or embedding pass
started) and `Heartbeat` (the thread). Does not own the hang rule (engine/worker_health.py)
nor the engine loop (engine/worker.py).

Why a thread: a step of a big prompt chunk on a busy CPU can take seconds, and a ping
answered only between steps would make a slow step look like a hang. The heartbeat
answers every `Ping` at once with a `Pong` that says how long the current step has run
(`busy_s`), so the API process tells the two apart: a process that answers nothing is
frozen (SIGSTOP, a deadlock holding the GIL), one that answers with a growing `busy_s` is
stuck in one step (llama.cpp releases the GIL inside `llama_decode`). The thread has its
own ZeroMQ socket (pings only) and its own connection to the API's output socket, so it
shares nothing with the engine thread but the `StepClock`, whose fields are single
attribute writes (atomic under the GIL).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from inferflux.engine.frames import ChannelClosed, FrameWriter
from inferflux.engine.messages import Ping, Pong, decode_input, encode

logger = logging.getLogger(__name__)

_POLL_MS = 250
_SEND_GIVE_UP_S = 30.0


@dataclass(slots=True)
class StepClock:
    """When the engine thread's current step (or embedding pass) started; written by the
    engine thread, read by the heartbeat."""

    started_at: float | None = None  # time.monotonic(); None between steps

    def begin(self) -> None:
        self.started_at = time.monotonic()

    def end(self) -> None:
        self.started_at = None

    def busy_s(self, now: float) -> float:
        """Seconds the current step has run; 0.0 between steps."""
        started = self.started_at
        return 0.0 if started is None else max(0.0, now - started)


class Heartbeat:
    """Answers `Ping`s on `address` with `Pong`s on a connection of its own to
    `output_path`, until `stop`. Start it once the model is loaded; `stop` joins it (its
    socket must be closed before the ZeroMQ context terminates)."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        *,
        worker_id: int,
        generation: int,
        address: str,
        output_path: str,
        orphaned: Callable[[], bool],
        clock: StepClock,
    ) -> None:
        self.context = context
        self.worker_id = worker_id
        self.generation = generation
        self.address = address
        self.output_path = output_path
        self.orphaned = orphaned
        self.clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{worker_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)

    def _run(self) -> None:
        pings = self.context.socket(zmq.PULL)
        pings.setsockopt(zmq.LINGER, 0)
        try:
            pings.connect(self.address)
            writer = FrameWriter(self.output_path, self.orphaned, give_up_s=_SEND_GIVE_UP_S)
        except (OSError, zmq.ZMQError) as exc:
            pings.close()
            logger.warning("worker %d: no heartbeat: %s", self.worker_id, exc)
            return
        try:
            with contextlib.suppress(ChannelClosed, zmq.ZMQError):
                self._answer(pings, writer)
        finally:
            writer.close()
            pings.close()

    def _answer(self, pings: zmq.Socket[bytes], writer: FrameWriter) -> None:
        while not self._stop.is_set():
            if not pings.poll(_POLL_MS):
                continue
            message = decode_input(pings.recv())
            if isinstance(message, Ping):
                pong = Pong(
                    worker_id=self.worker_id,
                    generation=self.generation,
                    seq=message.seq,
                    busy_s=self.clock.busy_s(time.monotonic()),
                )
                writer.send(encode(pong))
