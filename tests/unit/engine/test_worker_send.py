"""The worker's `_send` with `scheduler.stream_interval`: a step whose tokens were all held
back sends no message, and its step stats go with the next one; health pings answered by
the engine loop and by the heartbeat thread. Pure logic: the engine core and the outbox
are fakes."""

from __future__ import annotations

import socket as sockets
from collections.abc import Iterator

import pytest
import zmq

from inferflux.config.settings import ObservabilitySettings, SchedulerSettings
from inferflux.engine.backends.llama_cpp import ContextConfig
from inferflux.engine.engine_build import WorkerConfig
from inferflux.engine.heartbeat import Heartbeat, StepClock
from inferflux.engine.messages import (
    EngineOutput,
    EngineStats,
    FinishReason,
    Ping,
    Pong,
    Reconfigure,
    RequestDelta,
    StepOutputs,
    StepStats,
    decode_output,
    encode,
)
from inferflux.engine.worker import _WorkerLoop
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.request import PriorityClass


class FakeCore:
    """Counts the steps it ran since stats were last taken; nothing else."""

    handoffs = None  # unified mode: no KV channel

    def __init__(self) -> None:
        self.steps_since_take = 0

    def take_step_stats(self) -> StepStats | None:
        steps, self.steps_since_take = self.steps_since_take, 0
        return StepStats(step_exec_s=[0.01] * steps) if steps else None

    def stats(self) -> EngineStats:
        return EngineStats()


class FakeOutbox:
    """Records what the worker sends."""

    def __init__(self) -> None:
        self.sent: list[EngineOutput] = []

    def send(self, message: EngineOutput) -> None:
        self.sent.append(message)


@pytest.fixture
def inputs() -> Iterator[zmq.Socket[bytes]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.PULL)
    yield socket
    socket.close(linger=0)
    context.term()


def _loop(inputs: zmq.Socket[bytes], interval: int) -> tuple[_WorkerLoop, FakeCore, FakeOutbox]:
    config = WorkerConfig(
        worker_id=0,
        generation=1,
        input_address="",
        output_address="",
        context=ContextConfig("unused.gguf", 512, 1, 64, 1, 1, False),
        max_num_seqs=1,
        max_batch_tokens=64,
        observability=ObservabilitySettings(),
        scheduling=SchedulerSettings(stream_interval=interval),
    )
    core, outbox = FakeCore(), FakeOutbox()
    loop = _WorkerLoop(core, inputs, outbox, config, embeds=None)  # type: ignore[arg-type]
    return loop, core, outbox


def _token(n: int) -> RequestDelta:
    return RequestDelta(request_id="r", text=f"t{n}", token_ids=[n], num_output_tokens=n)


def _step(loop: _WorkerLoop, core: FakeCore, delta: RequestDelta) -> None:
    core.steps_since_take += 1
    loop._send([delta])


def test_held_steps_send_nothing_and_their_stats_travel_with_the_next_message(
    inputs: zmq.Socket[bytes],
) -> None:
    loop, core, outbox = _loop(inputs, interval=3)
    for n in range(1, 5):  # the first token at once, then 2, 3, 4 in one chunk
        _step(loop, core, _token(n))
    last = _token(5)
    last.finish_reason = FinishReason.LENGTH
    _step(loop, core, last)
    messages = [m for m in outbox.sent if isinstance(m, StepOutputs)]
    assert [[d.token_ids for d in m.deltas] for m in messages] == [[[1]], [[2, 3, 4]], [[5]]]
    # every step's stats arrive, each exactly once
    assert [len(m.step.step_exec_s) for m in messages if m.step] == [1, 3, 1]


def test_interval_one_sends_every_step(inputs: zmq.Socket[bytes]) -> None:
    loop, core, outbox = _loop(inputs, interval=1)
    for n in range(1, 4):
        _step(loop, core, _token(n))
    assert len(outbox.sent) == 3


class FakeScheduler:
    """Only the two attributes live tuning sets."""

    def __init__(self) -> None:
        self.policy: object = None
        self.max_batch_tokens = 64


def test_reconfigure_sets_every_scheduler_knob_and_caps_the_budget_at_the_batch(
    inputs: zmq.Socket[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    log_policies: list[ObservabilitySettings] = []  # not this test process's logging
    monkeypatch.setattr("inferflux.engine.worker.update_log_policy", log_policies.append)
    loop, core, _ = _loop(inputs, interval=1)
    core.scheduler = FakeScheduler()  # type: ignore[attr-defined]
    scheduler = SchedulerSettings(
        max_batch_tokens=1024,  # above the context's batch of 64: capped
        queue_timeout_s=2.0,
        aging_s=0.5,
        batch_window_ms=7.0,
        stream_interval=5,
        embed_tokens_per_step=9,
        burst_stall_ms=2500.0,
        fairness={"enable_preemption": False, "high_priority_threshold": "normal",
                  "max_timeslice_tokens": 11},
    )  # fmt: skip
    observability = ObservabilitySettings(log_level="warning")
    loop._reconfigure(
        Reconfigure(
            scheduler=scheduler.model_dump(mode="json"),
            observability=observability.model_dump(mode="json"),
        )
    )
    assert core.scheduler.max_batch_tokens == 64  # type: ignore[attr-defined]
    assert core.scheduler.policy == SchedulingPolicy(  # type: ignore[attr-defined]
        queue_timeout_s=2.0,
        aging_s=0.5,
        batch_window_s=0.007,
        burst_stall_s=2.5,
        enable_preemption=False,
        high_priority_threshold=PriorityClass.NORMAL,
        max_timeslice_tokens=11,
    )
    assert loop.stream.interval == 5
    assert loop.config.scheduling.embed_tokens_per_step == 9
    assert loop.config.max_batch_tokens == 64
    assert log_policies == [observability]


def test_the_heartbeat_answers_while_the_engine_thread_is_in_a_step(tmp_path) -> None:
    """The heartbeat thread answers a ping at once, with how long the step has run."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    out_path = str(tmp_path / "out.sock")
    listener = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
    listener.bind(out_path)
    listener.listen(1)
    pings = context.socket(zmq.PUSH)
    pings.bind(f"ipc://{tmp_path}/health")
    clock = StepClock()
    clock.begin()  # the engine thread is inside a step
    heartbeat = Heartbeat(context, worker_id=3, generation=2, address=f"ipc://{tmp_path}/health",
                          output_path=out_path, orphaned=lambda: False, clock=clock)  # fmt: skip
    heartbeat.start()
    try:
        connection, _ = listener.accept()
        connection.settimeout(5)
        pings.send(encode(Ping(9)))
        header = connection.recv(4, sockets.MSG_WAITALL)
        payload = connection.recv(int.from_bytes(header, "little"), sockets.MSG_WAITALL)
        pong = decode_output(payload)
        assert isinstance(pong, Pong) and (pong.worker_id, pong.generation, pong.seq) == (3, 2, 9)
        assert pong.busy_s >= 0.0
        connection.close()
    finally:
        heartbeat.stop()
        pings.close(linger=0)
        listener.close()
        context.term()
