"""StepRecorder: admissions, per-step sizes, phase stamps; and the new IPC fields round-trip."""

from __future__ import annotations

from inferflux.engine.messages import (
    AddRequest,
    EngineStats,
    FinishReason,
    SamplingParams,
    StepOutputs,
    decode_input,
    decode_output,
    encode,
)
from inferflux.engine.step_recorder import StepRecorder
from inferflux.scheduler import Request, RequestId, ScheduledChunk, SeqId
from inferflux.scheduler.request import PriorityClass


def make_request(rid: str, n_prompt: int = 4, priority=PriorityClass.NORMAL) -> Request:
    return Request(
        request_id=RequestId(rid),
        prompt_token_ids=list(range(n_prompt)),
        max_tokens=8,
        priority=priority,
        arrival_at=100.0,
    )


def chunk(request: Request, n: int, sample: bool) -> ScheduledChunk:
    return ScheduledChunk(request, SeqId(0), list(range(n)), request.num_computed_tokens, sample)


def test_nothing_happened_means_no_stats() -> None:
    assert StepRecorder().take(0, 0) is None


def test_a_request_is_admitted_once_with_its_queue_wait() -> None:
    recorder = StepRecorder()
    a = make_request("a", priority=PriorityClass.HIGH)
    recorder.on_scheduled([chunk(a, 2, False)], started_at=100.25)
    recorder.on_step_done([chunk(a, 2, False)], num_tokens=2, started_at=100.25)
    recorder.on_scheduled([chunk(a, 2, True)], started_at=101.0)  # its next chunk
    recorder.on_step_done([chunk(a, 2, True)], num_tokens=2, started_at=101.0)
    stats = recorder.take(4, 1)
    assert stats is not None
    assert [(x.request_id, x.priority, x.queue_wait_s) for x in stats.admitted] == [
        ("a", "high", 0.25)
    ]
    assert stats.step_num_seqs == [1, 1] and stats.step_num_tokens == [2, 2]
    assert len(stats.step_exec_s) == 2 and all(s >= 0 for s in stats.step_exec_s)
    assert (stats.num_prompt_tokens, stats.num_generated_tokens) == (4, 1)
    assert recorder.take(0, 0) is None  # taken: a fresh accumulation


def test_phases_of_a_finished_request() -> None:
    recorder = StepRecorder()
    a = make_request("a")
    recorder.on_scheduled([chunk(a, 4, True)], started_at=100.5)
    recorder.on_step_done([chunk(a, 4, True)], num_tokens=4, started_at=100.5)
    a.output_token_ids += [7, 8]
    recorder.on_finished(a, FinishReason.LENGTH)
    (phases,) = recorder.take(0, 0).finished
    assert phases.request_id == "a" and phases.finish_reason == "length"
    assert phases.added_at == 100.0 and phases.scheduled_at == 100.5
    assert phases.first_token_at is not None
    assert phases.scheduled_at <= phases.first_token_at <= phases.finished_at
    assert (phases.num_prompt_tokens, phases.num_output_tokens) == (4, 2)


def test_a_request_that_never_ran_has_no_scheduled_or_first_token_stamp() -> None:
    recorder = StepRecorder()
    recorder.on_finished(make_request("q"), FinishReason.TIMEOUT)
    (phases,) = recorder.take(0, 0).finished
    assert phases.scheduled_at is None and phases.first_token_at is None
    assert phases.finish_reason == "timeout"


def test_a_request_finished_at_its_first_token_gets_a_first_token_stamp() -> None:
    recorder = StepRecorder()
    a = make_request("a")
    recorder.on_scheduled([chunk(a, 4, True)], started_at=100.5)
    a.output_token_ids.append(7)
    recorder.on_finished(a, FinishReason.STOP)  # inside the step, before on_step_done
    recorder.on_step_done([chunk(a, 4, True)], num_tokens=4, started_at=100.5)
    (phases,) = recorder.take(0, 0).finished
    assert phases.first_token_at == phases.finished_at


def test_trace_context_and_step_stats_cross_the_ipc_boundary() -> None:
    add = AddRequest(
        request_id="r",
        prompt_token_ids=[1, 2],
        sampling=SamplingParams(max_tokens=3),
        trace_context={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
    )
    assert decode_input(encode(add)) == add
    recorder = StepRecorder()
    a = make_request("a")
    recorder.on_scheduled([chunk(a, 4, True)], started_at=100.5)
    recorder.on_step_done([chunk(a, 4, True)], num_tokens=4, started_at=100.5)
    recorder.on_finished(a, FinishReason.ABORT)
    message = StepOutputs(
        worker_id=0, generation=1, deltas=[], stats=EngineStats(), step=recorder.take(4, 0)
    )
    assert decode_output(encode(message)) == message
