"""Requirement 11.5: every native response round-trips through its pydantic model
(serialize → deserialize → equal), both as the JSON body and as the SSE event bytes."""

from __future__ import annotations

from typing import get_args

from hypothesis import given
from hypothesis import strategies as st

from inferflux.api.native.protocol import (
    NativeAssistantMessage,
    NativeChatResponse,
    NativeFinishReason,
    NativeGenerateResponse,
    NativeStreamEvent,
    NativeTimings,
    NativeUsage,
)
from inferflux.api.sse import sse_data

counts = st.integers(min_value=0, max_value=2**63 - 1)
seconds = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
finish_reasons = st.sampled_from(get_args(NativeFinishReason))
usages = st.builds(
    NativeUsage,
    prompt_tokens=counts,
    completion_tokens=counts,
    total_tokens=counts,
    cached_tokens=counts,
)
timings = st.builds(NativeTimings, ttft_s=st.none() | seconds, total_s=seconds)
finished = {
    "request_id": st.text(),
    "created": st.integers(min_value=0, max_value=2**63 - 1),
    "model": st.text(),
    "finish_reason": finish_reasons,
    "usage": usages,
    "timings": timings,
}
generate_responses = st.builds(NativeGenerateResponse, text=st.text(), **finished)
chat_responses = st.builds(
    NativeChatResponse, message=st.builds(NativeAssistantMessage, content=st.text()), **finished
)
stream_events = st.builds(
    NativeStreamEvent,
    request_id=st.text(),
    index=counts,
    token=st.text(),
    finish_reason=st.none() | finish_reasons,
    usage=st.none() | usages,
    timings=st.none() | timings,
)


@given(st.one_of(generate_responses, chat_responses, stream_events))
def test_responses_round_trip_through_json(
    response: NativeGenerateResponse | NativeChatResponse | NativeStreamEvent,
) -> None:
    assert type(response).model_validate_json(response.model_dump_json()) == response


@given(stream_events)
def test_stream_events_round_trip_through_the_sse_bytes(event: NativeStreamEvent) -> None:
    wire = sse_data(event.model_dump(mode="json"))  # exactly what the route sends
    assert wire.startswith(b"data: ") and wire.endswith(b"\n\n")
    assert NativeStreamEvent.model_validate_json(wire[len(b"data: ") : -2]) == event
