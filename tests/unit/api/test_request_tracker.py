"""RequestTracker: phases in order, bounded history and token traces."""

from __future__ import annotations

from inferflux.api.request_tracker import RequestTracker
from inferflux.engine.messages import (
    AddRequest,
    FinishReason,
    RequestDelta,
    RequestPhases,
    SamplingParams,
)


def add(rid: str) -> AddRequest:
    return AddRequest(
        request_id=rid, prompt_token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=9)
    )


def token(rid: str, n: int, finish: FinishReason | None = None) -> RequestDelta:
    return RequestDelta(
        request_id=rid, text="x", token_ids=[n], num_output_tokens=n, finish_reason=finish
    )


def test_phases_follow_the_request() -> None:
    tracker = RequestTracker(history=10, max_events=10, keep_text=False)
    tracked = tracker.start(add("a"))
    assert tracked.phase == "queued" and tracker.live() == [tracked]
    tracker.on_admitted("a", 0.25)
    assert tracked.phase == "prefill" and tracked.queue_wait_s == 0.25
    tracker.on_delta(tracked, token("a", 1), tracked.submitted_at + 0.5)
    assert tracked.phase == "decode" and tracked.first_token_s == 0.5
    tracker.on_delta(tracked, token("a", 2, FinishReason.LENGTH), tracked.submitted_at + 0.6)
    tracker.finish(tracked, tracked.submitted_at + 0.6)
    assert tracked.phase == "finished" and tracked.finish_reason == "length"
    assert tracker.live() == [] and tracker.recent() == [tracked]
    summary = tracked.summary(0.0)
    assert summary["num_output_tokens"] == 2 and summary["elapsed_s"] == 0.6
    assert [e["token_ids"] for e in tracked.detail(0.0)["trace"]] == [[1], [2]]
    assert all(e["text"] is None for e in tracked.detail(0.0)["trace"])


def test_the_workers_phases_split_the_time_to_first_token() -> None:
    tracker = RequestTracker(history=10, max_events=10, keep_text=False)
    tracked = tracker.start(add("a"))
    tracker.on_delta(tracked, token("a", 1, FinishReason.LENGTH), tracked.submitted_at + 0.5)
    tracker.finish(tracked, tracked.submitted_at + 0.5)
    summary = tracked.summary(0.0)
    assert summary["engine_time_to_first_token_s"] is None  # the worker's stats come later
    # worker clock: arrived at 10.0, first step at 10.1, first token at 10.4
    tracker.on_phases(RequestPhases("a", "normal", 10.0, 10.1, 10.4, 10.4, 3, 0, 1, "length"))
    tracker.on_phases(RequestPhases("ghost", "normal", 1.0, 1.0, 2.0, 2.0, 3, 0, 1, "length"))
    summary = tracked.summary(0.0)
    assert summary["engine_time_to_first_token_s"] == 0.4
    assert summary["engine_prefill_s"] == 0.3
    assert summary["time_to_first_token_s"] == 0.5  # 0.1 on the way and in this process


def test_admission_of_an_unknown_or_late_request_is_ignored() -> None:
    tracker = RequestTracker(history=10, max_events=10, keep_text=True)
    tracker.on_admitted("ghost", 1.0)
    tracked = tracker.start(add("a"))
    tracker.on_delta(tracked, token("a", 1), tracked.submitted_at)
    tracker.on_admitted("a", 9.0)  # its StepStats came after the first token
    assert tracked.phase == "decode" and tracked.queue_wait_s is None


def test_history_is_a_ring_buffer() -> None:
    tracker = RequestTracker(history=3, max_events=10, keep_text=False)
    for i in range(5):
        tracked = tracker.start(add(f"r{i}"))
        tracker.finish(tracked, tracked.submitted_at)
    assert [t.request_id for t in tracker.recent()] == ["r4", "r3", "r2"]
    assert tracker.get("r0") is None and tracker.get("r4") is not None


def test_history_zero_keeps_nothing_finished() -> None:
    tracker = RequestTracker(history=0, max_events=10, keep_text=False)
    tracked = tracker.start(add("a"))
    tracker.finish(tracked, tracked.submitted_at)
    assert tracker.recent() == [] and tracker.get("a") is None


def test_trace_is_capped_and_counts_what_it_dropped() -> None:
    tracker = RequestTracker(history=1, max_events=4, keep_text=True)
    tracked = tracker.start(add("a"))
    for n in range(1, 11):
        tracker.on_delta(tracked, token("a", n), tracked.submitted_at)
    assert len(tracked.events) == 4 and tracked.num_dropped_events == 6
    assert tracked.num_output_tokens == 10
    assert tracked.detail(0.0)["trace"][0]["text"] == "x"


def test_abandoned_and_failed_requests_say_so() -> None:
    tracker = RequestTracker(history=5, max_events=5, keep_text=False)
    gone = tracker.start(add("gone"))
    tracker.finish(gone, gone.submitted_at)
    failed = tracker.start(add("failed"))
    tracker.finish(failed, failed.submitted_at, error="EngineDeadError: the worker died")
    assert (gone.finish_reason, gone.error) == ("abort", None)
    assert failed.finish_reason == "error" and "worker died" in failed.error
