"""The IPC contract: every message survives encode → decode unchanged (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from inferflux.engine.messages import (
    OPENAI_FINISH_REASON,
    AbortRequests,
    AddRequest,
    EngineStats,
    FinishReason,
    RequestDelta,
    SamplingParams,
    Shutdown,
    StepOutputs,
    WorkerFailed,
    WorkerReady,
    decode_input,
    decode_output,
    encode,
)

ids = st.text(min_size=1, max_size=40)
counts = st.integers(min_value=0, max_value=2**31)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)

sampling = st.builds(
    SamplingParams,
    max_tokens=st.integers(min_value=1, max_value=1 << 20),
    temperature=finite,
    top_p=finite,
    top_k=counts,
    min_p=finite,
    seed=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
    logit_bias=st.dictionaries(counts, finite, max_size=5),
    stop=st.lists(st.text(min_size=1), max_size=4),
    ignore_eos=st.booleans(),
)
add_requests = st.builds(
    AddRequest, request_id=ids, prompt_token_ids=st.lists(counts, max_size=50), sampling=sampling
)
inputs = add_requests | st.builds(AbortRequests, st.lists(ids, max_size=5)) | st.just(Shutdown())

deltas = st.builds(
    RequestDelta,
    request_id=ids,
    text=st.text(),
    token_ids=st.lists(counts, max_size=8),
    finish_reason=st.none() | st.sampled_from(FinishReason),
    num_prompt_tokens=counts,
    num_output_tokens=counts,
    error=st.none() | st.text(),
)
stats = st.builds(EngineStats, num_running=counts, num_waiting=counts, num_steps=counts)
outputs = (
    st.builds(
        StepOutputs,
        worker_id=counts,
        generation=counts,
        deltas=st.lists(deltas, max_size=4),
        stats=stats,
    )
    | st.builds(WorkerReady, worker_id=counts, generation=counts, pid=counts, load_s=finite)
    | st.builds(WorkerFailed, worker_id=counts, generation=counts, message=st.text())
)


@given(inputs)
def test_every_input_message_round_trips(message) -> None:
    assert decode_input(encode(message)) == message


@given(outputs)
def test_every_output_message_round_trips(message) -> None:
    assert decode_output(encode(message)) == message


def test_every_finish_reason_has_an_openai_name() -> None:
    assert set(OPENAI_FINISH_REASON) == set(FinishReason)
    assert OPENAI_FINISH_REASON[FinishReason.STOP_SEQUENCE] == "stop"
