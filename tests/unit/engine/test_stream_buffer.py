"""`StreamBuffer` (scheduler.stream_interval): which deltas leave a step, and merged how."""

from __future__ import annotations

from inferflux.engine.messages import FinishReason, RequestDelta, TokenLogprob
from inferflux.engine.stream_buffer import StreamBuffer, merge_deltas


def _token(request_id: str, n: int, *, logprobs: bool = False) -> RequestDelta:
    """The delta of a request's n-th sampled token (token id n, text 't<n>')."""
    return RequestDelta(
        request_id=request_id,
        text=f"t{n}",
        token_ids=[n],
        num_prompt_tokens=5,
        num_output_tokens=n,
        logprobs=[TokenLogprob(n, -float(n), [])] if logprobs else None,
    )


def _finish(delta: RequestDelta, reason: FinishReason = FinishReason.LENGTH) -> RequestDelta:
    delta.finish_reason = reason
    return delta


def test_interval_one_passes_every_delta_untouched() -> None:
    buffer = StreamBuffer(1)
    deltas = [_token("a", 1), _token("b", 1)]
    assert buffer.take(deltas) is deltas


def test_first_token_at_once_then_chunks_of_interval_tokens() -> None:
    buffer = StreamBuffer(3)
    sent = [buffer.take([_token("a", n)]) for n in range(1, 9)]
    assert [[d.token_ids for d in step] for step in sent] == [
        [[1]],  # time to first token is not delayed
        [],
        [],
        [[2, 3, 4]],
        [],
        [],
        [[5, 6, 7]],
        [],
    ]
    merged = sent[3][0]
    assert merged.text == "t2t3t4"
    assert merged.num_output_tokens == 4  # counts come from the latest delta
    assert buffer.num_held == 1


def test_a_finish_flushes_what_was_held_in_one_delta() -> None:
    buffer = StreamBuffer(4)
    buffer.take([_token("a", 1)])
    buffer.take([_token("a", 2)])
    buffer.take([_token("a", 3)])
    (last,) = buffer.take([_finish(_token("a", 4), FinishReason.STOP)])
    assert last.token_ids == [2, 3, 4]
    assert last.text == "t2t3t4"
    assert last.finish_reason is FinishReason.STOP
    assert buffer.num_held == 0


def test_an_abort_without_tokens_flushes_the_held_tokens() -> None:
    buffer = StreamBuffer(8)
    buffer.take([_token("a", 1)])
    buffer.take([_token("a", 2)])
    abort = RequestDelta(request_id="a", finish_reason=FinishReason.ABORT, num_output_tokens=2)
    (last,) = buffer.take([abort])
    assert last.token_ids == [2]
    assert last.finish_reason is FinishReason.ABORT


def test_a_request_done_in_its_first_delta_leaves_nothing_behind() -> None:
    buffer = StreamBuffer(4)
    (only,) = buffer.take([_finish(_token("a", 1))])
    assert only.token_ids == [1]
    assert buffer.take([_token("a", 1)])[0].token_ids == [1]  # same id again: a new request


def test_requests_are_buffered_independently() -> None:
    buffer = StreamBuffer(2)
    assert [d.request_id for d in buffer.take([_token("a", 1), _token("b", 1)])] == ["a", "b"]
    assert buffer.take([_token("a", 2), _token("b", 2)]) == []
    out = buffer.take([_token("a", 3), _finish(_token("b", 3))])
    assert [(d.request_id, d.token_ids) for d in out] == [("a", [2, 3]), ("b", [2, 3])]


def test_merge_concatenates_logprobs_and_keeps_the_first_prompt_logprobs() -> None:
    first = _token("a", 1, logprobs=True)
    first.prompt_logprobs = [None, TokenLogprob(7, -0.5, [])]
    merged = merge_deltas(first, _token("a", 2, logprobs=True))
    assert merged.token_ids == [1, 2]
    assert merged.logprobs is not None
    assert [lp.token_id for lp in merged.logprobs] == [1, 2]
    assert merged.prompt_logprobs == first.prompt_logprobs
    assert merge_deltas(_token("a", 1), _token("a", 2)).logprobs is None


def test_a_held_request_sends_its_first_token_then_what_each_hold_gathered() -> None:
    buffer = StreamBuffer(1)
    buffer.hold("a", 0.25)
    sent = [buffer.take([_token("a", n)], now=0.1 * n) for n in range(1, 9)]
    assert [[d.token_ids for d in step] for step in sent] == [
        [[1]],  # at once: time to first token, and the API opens the response on it
        [],  # t=0.2: held until 0.45
        [],
        [],
        [[2, 3, 4, 5]],  # t=0.5
        [],  # t=0.6: held until 0.85
        [],
        [],
    ]
    (last,) = buffer.take([_finish(_token("a", 9))], now=0.9)
    assert last.token_ids == [6, 7, 8, 9] and last.finish_reason is FinishReason.LENGTH
    assert buffer.num_held == 0
    # the finish ended the hold: a later request with the same id streams
    assert buffer.take([_token("a", 1)], now=1.0)[0].token_ids == [1]
    assert buffer.take([_token("a", 2)], now=1.1)[0].token_ids == [2]


def test_a_paused_held_request_sends_its_tokens_by_their_time() -> None:
    buffer = StreamBuffer(1)
    buffer.hold("a", 0.25)
    buffer.take([_token("a", 1)], now=0.0)
    assert buffer.take([_token("a", 2)], now=0.1) == []
    assert buffer.take([], now=0.3) == []  # preempted: no delta this step, not due yet
    (late,) = buffer.take([], now=0.4)
    assert late.token_ids == [2] and buffer.num_held == 0


def test_a_streamed_request_beside_a_held_one_is_untouched() -> None:
    buffer = StreamBuffer(1)
    buffer.hold("collected", 0.25)
    buffer.take([_token("collected", 1), _token("streamed", 1)], now=0.0)
    out = buffer.take([_token("collected", 2), _token("streamed", 2)], now=0.1)
    assert [(d.request_id, d.token_ids) for d in out] == [("streamed", [2])]
