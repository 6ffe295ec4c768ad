"""The worker loop: drive `EngineCore.step()`, take messages over ZeroMQ, send frames.

Owns: the receive → step → send loop, and exiting when the API process is gone. Does
not own: building the engine from its picklable `WorkerConfig` (engine_build.py), or any
engine logic (core.py).
The same `run_worker` runs in a spawned process (default) or on a thread (in-process
mode); only `WorkerConfig.exit_with_parent` and signal handling differ.

Per step the worker sends at most one `StepOutputs`, carrying the deltas of every
request that changed. While idle it blocks on the input socket. Embedding requests queue
in an `EmbedQueue`; it runs one bounded forward pass after each step and each finished
request leaves as one `EmbedResult`. A heartbeat thread (heartbeat.py) answers the API's
health pings, also during a long step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import time
from collections import deque

import zmq

from inferflux.config.settings import (
    ObservabilitySettings,
    SchedulerSettings,
)
from inferflux.engine.core import EngineCore
from inferflux.engine.embed_queue import EmbedOutcome, EmbedQueue
from inferflux.engine.engine_build import (
    WorkerConfig,
    build_engine_core,
    embedder_factory,
    offload_of,
    scheduling_policy,
)
from inferflux.engine.frames import ChannelClosed, FrameWriter
from inferflux.engine.heartbeat import Heartbeat, StepClock
from inferflux.engine.messages import (
    AbortRequests,
    AddRequest,
    EmbedRequest,
    EmbedResult,
    EngineInput,
    EngineOutput,
    Priority,
    Reconfigure,
    RequestDelta,
    Shutdown,
    StepOutputs,
    WorkerFailed,
    WorkerReady,
    decode_input,
    encode,
)
from inferflux.engine.spans import EngineSpans
from inferflux.engine.stream_buffer import StreamBuffer
from inferflux.errors import InferfluxError
from inferflux.observability.logging import configure_logging, update_log_policy
from inferflux.observability.tracing import get_tracer, make_tracer_provider

logger = logging.getLogger(__name__)

_IDLE_POLL_MS = 250
# An embedding pass beside generations lasts about one engine step, at least this long;
# alone but within the interactive window of the last generation step, at most about this
# long (a full 512-token pass is a second or more on 2 cores).
_MIN_EMBED_PASS_S = 0.005
_IDLE_EMBED_PASS_S = 0.25
_INTERACTIVE_WINDOW_S = 10.0
_SEND_GIVE_UP_S = 30.0


def worker_process_main(config: WorkerConfig) -> None:
    """Entry point of a spawned worker process."""
    # NOTE: Ctrl-C reaches the whole process group; the API process coordinates
    # shutdown, so the worker ignores SIGINT instead of dying mid-step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(config.observability, file_suffix=f".worker-{config.worker_id}")
    if config.cpus:
        try:
            os.sched_setaffinity(0, config.cpus)
        except OSError as exc:  # a CPU id the machine lacks: run unpinned, say so
            logger.warning(
                "worker %d: cannot pin to CPUs %s: %s", config.worker_id, config.cpus, exc
            )
    run_worker(config)


def run_worker(config: WorkerConfig) -> None:
    """Load the engine, report ready (or failed), then serve until Shutdown.

    Uses a ZeroMQ context of its own (ipc:// works across contexts), so the same code
    serves a spawned process and a thread of the API process.
    """
    zmq_context = zmq.Context()
    try:
        _serve(config, zmq_context)
    finally:
        zmq_context.term()


class _ApiGone(Exception):
    """The API process stopped reading worker output: it died, or stalled for too long."""


class _Outbox:
    """The worker's output: one frame per message over the Unix socket the API listens
    on (frames.py).

    NOTE: a writer whose reader stalls would block forever and leave an orphaned worker
    holding the model and KV cache. `FrameWriter` waits in one-second polls, asks
    `orphaned()` at each, and gives up once the API process is gone or has not read
    anything for `_SEND_GIVE_UP_S`. Every send also checks the parent first, so a worker
    whose API died exits at its next step instead of generating for nobody.
    """

    def __init__(self, path: str, exit_with_parent: bool) -> None:
        self.exit_with_parent = exit_with_parent
        self.parent_pid = os.getppid()
        try:
            self.writer = FrameWriter(path, self.orphaned, give_up_s=_SEND_GIVE_UP_S)
        except OSError as exc:
            raise _ApiGone(f"cannot reach the API process at {path}: {exc}") from None

    def orphaned(self) -> bool:
        return self.exit_with_parent and os.getppid() != self.parent_pid

    def send(self, message: EngineOutput) -> None:
        if self.orphaned():  # one getppid() syscall
            raise _ApiGone("the API process is gone")
        try:
            self.writer.send(encode(message))
        except ChannelClosed as exc:
            raise _ApiGone(str(exc)) from None

    def close(self) -> None:
        self.writer.close()


def _serve(config: WorkerConfig, zmq_context: zmq.Context[zmq.Socket[bytes]]) -> None:
    inputs = zmq_context.socket(zmq.PULL)
    inputs.setsockopt(zmq.LINGER, 0)
    inputs.connect(config.input_address)
    try:
        outbox = _Outbox(config.output_address, config.exit_with_parent)
        try:
            _load_and_serve(config, inputs, outbox, zmq_context)
        finally:
            outbox.close()
    except _ApiGone as exc:
        logger.warning("worker %d exits: %s", config.worker_id, exc)
    finally:
        inputs.close()


def _heartbeat(
    config: WorkerConfig, context: zmq.Context[zmq.Socket[bytes]], outbox: _Outbox
) -> tuple[Heartbeat | None, StepClock]:
    clock = StepClock()
    if not config.health_address:
        return None, clock
    heartbeat = Heartbeat(
        context,
        worker_id=config.worker_id,
        generation=config.generation,
        address=config.health_address,
        output_path=config.output_address,
        orphaned=outbox.orphaned,
        clock=clock,
    )
    return heartbeat, clock


def _load_and_serve(
    config: WorkerConfig,
    inputs: zmq.Socket[bytes],
    outbox: _Outbox,
    zmq_context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    started_at = time.monotonic()
    try:
        core = build_engine_core(config)
    except InferfluxError as exc:
        logger.error("worker %d failed to start: %s", config.worker_id, exc.message)
        failed = WorkerFailed(
            worker_id=config.worker_id, generation=config.generation, message=exc.message
        )
        outbox.send(failed)
        return
    plan = offload_of(core)
    ready = WorkerReady(
        worker_id=config.worker_id,
        generation=config.generation,
        pid=os.getpid(),
        load_s=time.monotonic() - started_at,
        backend=plan.backend,
        requested_backend=plan.requested,
        fallback_reason=plan.fallback_reason,
    )
    embeds = EmbedQueue(embedder_factory(core, config))
    provider = make_tracer_provider(
        config.observability.tracing, component=f"worker-{config.worker_id}"
    )
    tracer = get_tracer(provider)
    spans = EngineSpans(tracer, config.worker_id) if tracer is not None else None
    heartbeat, clock = _heartbeat(config, zmq_context, outbox)
    try:
        if heartbeat is not None:
            heartbeat.start()  # before WorkerReady: the API pings once it is ready
        outbox.send(ready)
        logger.info("worker %d ready in %.2fs", config.worker_id, ready.load_s)
        _WorkerLoop(core, inputs, outbox, config, embeds, spans, clock).run()
    finally:
        if heartbeat is not None:
            heartbeat.stop()  # NOTE: its socket closes before the ZeroMQ context ends
        embeds.close()  # NOTE: before core.close(), which frees the model it uses
        core.close()
        if provider is not None:
            provider.shutdown()  # flushes the spans still batched


class _WorkerLoop:
    def __init__(
        self,
        core: EngineCore,
        inputs: zmq.Socket[bytes],
        outbox: _Outbox,
        config: WorkerConfig,
        embeds: EmbedQueue,
        spans: EngineSpans | None = None,
        clock: StepClock | None = None,
    ) -> None:
        self.core = core
        self.clock = clock if clock is not None else StepClock()  # read by the heartbeat
        self.inputs = inputs
        self.outbox = outbox
        self.config = config
        self.embeds = embeds
        self.spans = spans  # None when tracing is off
        self.stream = StreamBuffer(config.scheduling.stream_interval)
        self._generated_at = -math.inf  # time.monotonic() of the last engine step
        self.poller = zmq.Poller()
        self.poller.register(inputs, zmq.POLLIN)
        # messages read during a step (`_high_arrived`), applied before any newer one
        self._early: deque[EngineInput] = deque()
        core.high_arrived = self._high_arrived

    def run(self) -> None:
        while True:
            timeout = _IDLE_POLL_MS
            if self.embeds.has_work():
                timeout = 0
            elif self.core.has_work():
                timeout = math.ceil(self.core.wait_s() * 1000)
            deltas: list[RequestDelta] = []
            ready = bool(self._early) or bool(self.poller.poll(timeout))
            if ready and self._drain_inputs(deltas):
                self._send(deltas)
                return
            step_s = 0.0
            if self.core.has_work():
                started = time.monotonic()
                self.clock.begin()
                deltas.extend(self.core.step())
                self.clock.end()
                self._generated_at = time.monotonic()
                step_s = self._generated_at - started
            self._send(deltas)
            if self.core.kv_offload is not None:
                self.core.kv_offload.tick(self.core.scheduler.prefix_cache)
            if self.embeds.has_work():
                self.clock.begin()
                self._embed_pass(step_s)
                self.clock.end()
            elif not deltas and not self.core.has_work() and self.outbox.orphaned():
                logger.warning("worker %d: API process is gone; exiting", self.config.worker_id)
                return

    def _embed_pass(self, step_s: float) -> None:
        """One bounded embedding pass between engine steps (embed_queue.py). While
        generations run it takes at most as long as the step before it and at most
        `scheduler.embed_tokens_per_step` tokens, so a large embeddings request costs each
        stream about one step more per token, not a whole batch. Within
        `_INTERACTIVE_WINDOW_S` of the last generation step a pass alone lasts at most
        about `_IDLE_EMBED_PASS_S`, so the next chat waits little for it to end; with no
        generation for longer, passes are whole batches (the fastest per token: measured
        322 tok/s at 512 tokens against 254 at 64, SmolLM2 on 2 cores)."""
        if self.core.has_work():
            max_tokens = self.config.scheduling.embed_tokens_per_step
            max_s = max(step_s, _MIN_EMBED_PASS_S)
            outcomes = self.embeds.step(max_tokens=max_tokens, max_seconds=max_s)
        elif time.monotonic() - self._generated_at < _INTERACTIVE_WINDOW_S:
            outcomes = self.embeds.step(max_seconds=_IDLE_EMBED_PASS_S)
        else:
            outcomes = self.embeds.step()
        self._send_embeddings(outcomes)

    def _high_arrived(self) -> bool:
        """Asked during a step that may be interrupted (EngineCore): read what arrived
        meanwhile (kept, in order, for `_drain_inputs`); True when it holds a new
        high-priority request. Runs on this thread: llama.cpp calls its abort callback on
        the thread that called llama_decode."""
        high = False
        while (message := self._read_socket()) is not None:
            self._early.append(message)
            high = high or (isinstance(message, AddRequest) and message.priority == Priority.HIGH)
        return high

    def _read_socket(self) -> EngineInput | None:
        try:
            return decode_input(self.inputs.recv(zmq.NOBLOCK))
        except zmq.Again:
            return None

    def _next_input(self) -> EngineInput | None:
        return self._early.popleft() if self._early else self._read_socket()

    def _drain_inputs(self, deltas: list[RequestDelta]) -> bool:
        """Apply every queued message. Returns True on Shutdown (after aborting all)."""
        while True:
            message = self._next_input()
            if message is None:
                return False
            if isinstance(message, AddRequest):
                rejected = self.core.add_request(message)
                deltas.extend(rejected)
                if message.hold_s > 0 and not rejected:
                    self.stream.hold(message.request_id, message.hold_s)
                if self.spans is not None and not rejected:
                    self.spans.on_added(message.request_id, message.trace_context)
            elif isinstance(message, AbortRequests):
                deltas.extend(self.core.abort_requests(message.request_ids))
                self.embeds.abort(message.request_ids)
            elif isinstance(message, EmbedRequest):
                self._send_embeddings(self.embeds.add(message))
            elif isinstance(message, Reconfigure):
                self._reconfigure(message)
            elif isinstance(message, Shutdown):
                deltas.extend(self.core.abort_requests(self.core.request_ids()))
                return True

    def _reconfigure(self, message: Reconfigure) -> None:
        """Live tuning: the scheduler's knobs, the step budget (never above the context's
        batch), the stream interval, the embedding share and the log policy."""
        scheduling = SchedulerSettings.model_validate(message.scheduler)
        budget = min(scheduling.max_batch_tokens, self.config.context.n_batch)
        self.config = dataclasses.replace(
            self.config, scheduling=scheduling, max_batch_tokens=budget
        )
        self.core.scheduler.policy = scheduling_policy(scheduling)
        self.core.scheduler.max_batch_tokens = budget
        self.stream.interval = scheduling.stream_interval
        update_log_policy(ObservabilitySettings.model_validate(message.observability))
        logger.info("worker %d: settings changed at runtime", self.config.worker_id)

    def _send(self, deltas: list[RequestDelta]) -> None:
        """One StepOutputs with these deltas and the step stats since the last one; nothing
        when there is neither (an idle loop turn)."""
        produced = bool(deltas)
        deltas = self.stream.take(deltas)
        if produced and not deltas:
            return  # all held back (stream_interval): the stats go with the next message
        step = self.core.take_step_stats()
        if not deltas and step is None:
            return
        handoffs = self.core.handoffs
        if handoffs is not None:  # taken whether traced or not: the list stays short
            transfers = handoffs.end.recorder.take_transfers()
            if transfers and self.spans is not None:
                self.spans.on_transfers(transfers)
        if step is not None and self.spans is not None:
            self.spans.on_finished(step.finished)
        message = StepOutputs(
            worker_id=self.config.worker_id,
            generation=self.config.generation,
            deltas=deltas,
            stats=self.core.stats(),
            step=step,
        )
        self.outbox.send(message)

    def _send_embeddings(self, outcomes: list[EmbedOutcome]) -> None:
        for outcome in outcomes:
            vectors = outcome.vectors
            self.outbox.send(
                EmbedResult(
                    worker_id=self.config.worker_id,
                    generation=self.config.generation,
                    request_id=outcome.request_id,
                    embeddings=b"" if vectors is None else vectors.astype("<f4").tobytes(),
                    n_embd=0 if vectors is None else int(vectors.shape[1]),
                    num_tokens=outcome.num_tokens,
                    error=outcome.error,
                )
            )
