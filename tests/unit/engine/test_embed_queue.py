"""EmbedQueue: packing inputs into bounded forward passes, chunk means, failure isolation."""

from __future__ import annotations

import numpy as np
import pytest

from inferflux.engine.embed_queue import MIN_PASS_TOKENS, EmbedOutcome, EmbedQueue
from inferflux.engine.messages import (
    EmbedRequest,
    EmbedResult,
    decode_input,
    decode_output,
    encode,
)
from inferflux.errors import ModelLoadError
from tests.fakes.embedding import FakeEmbeddingBackend, mean_vector


def make_queue(**knobs) -> tuple[EmbedQueue, FakeEmbeddingBackend]:
    backend = FakeEmbeddingBackend(**knobs)
    return EmbedQueue(lambda: backend), backend


def request(request_id: str, *inputs: list[int], normalize: bool = True) -> EmbedRequest:
    return EmbedRequest(request_id=request_id, inputs=list(inputs), normalize=normalize)


def run_all(queue: EmbedQueue, max_steps: int = 100) -> list[EmbedOutcome]:
    outcomes: list[EmbedOutcome] = []
    for _ in range(max_steps):
        if not queue.has_work():
            return outcomes
        outcomes.extend(queue.step())
    raise AssertionError("the queue never drained")


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def test_short_inputs_of_two_requests_share_one_forward_pass() -> None:
    queue, backend = make_queue()
    assert queue.add(request("a", [5, 6, 7], [8])) == []
    assert queue.add(request("b", [9, 10])) == []
    outcomes = queue.step()
    assert not queue.has_work()
    assert len(backend.batches) == 1
    assert [(s, t, p) for s, t, p, _ in backend.batches[0]] == [
        (0, [5, 6, 7], 0),
        (1, [8], 0),
        (2, [9, 10], 0),
    ]
    by_id = {o.request_id: o for o in outcomes}
    assert by_id["a"].num_tokens == 4 and by_id["b"].num_tokens == 2
    assert by_id["a"].vectors is not None and by_id["a"].vectors.dtype == np.float32
    np.testing.assert_allclose(by_id["a"].vectors[0], unit(mean_vector([5, 6, 7])), rtol=1e-6)
    np.testing.assert_allclose(by_id["a"].vectors[1], unit(mean_vector([8])), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(by_id["b"].vectors, axis=1), 1.0, rtol=1e-6)
    assert sorted(backend.freed) == [0, 1, 2]


def test_a_long_input_spans_passes_and_its_chunk_means_combine_to_the_full_mean() -> None:
    queue, backend = make_queue(max_batch_tokens=16)
    tokens = list(range(1, 41))  # 40 tokens: chunks of 16, 16, 8
    queue.add(request("long", tokens, normalize=False))
    outcomes = run_all(queue)
    assert [[(s, len(t), p) for s, t, p, _ in batch] for batch in backend.batches] == [
        [(0, 16, 0)],
        [(0, 16, 16)],
        [(0, 8, 32)],
    ]
    (outcome,) = outcomes
    assert outcome.vectors is not None
    np.testing.assert_allclose(outcome.vectors[0], mean_vector(tokens), rtol=1e-6)


def test_passes_never_exceed_the_token_budget_or_the_sequence_count() -> None:
    queue, backend = make_queue(max_batch_tokens=16, n_seq_max=2, max_seq_tokens=64)
    queue.add(request("r", *[[i + 1] * 7 for i in range(5)]))
    (outcome,) = run_all(queue)
    assert outcome.vectors is not None and outcome.vectors.shape == (5, 3)
    for batch in backend.batches:
        assert sum(len(t) for _, t, _, _ in batch) <= 16
        assert len({s for s, _, _, _ in batch}) == len(batch) <= 2
    for index in range(5):
        expected = unit(mean_vector([index + 1] * 7))
        np.testing.assert_allclose(outcome.vectors[index], expected, rtol=1e-6)


def test_admission_waits_for_kv_cells_first_come_first_served() -> None:
    queue, backend = make_queue(max_batch_tokens=16, max_seq_tokens=40)
    queue.add(request("big", list(range(1, 31))))  # 30 cells
    queue.add(request("small", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]))  # 11: would make 41
    queue.step()
    assert {s for s, _, _, _ in backend.batches[0]} == {0}
    outcomes = run_all(queue)
    assert {o.request_id for o in outcomes} == {"big", "small"}


def test_a_failed_pass_fails_only_its_requests_and_the_queue_goes_on() -> None:
    queue, backend = make_queue(n_seq_max=1, fail_on={666})
    queue.add(request("bad", [1, 666, 3]))
    queue.add(request("late", [7, 8, 9, 10, 11]))  # waits for a free sequence
    first = queue.step()
    assert [(o.request_id, o.error) for o in first] == [("bad", "fake decode failure")]
    assert first[0].vectors is None
    assert 0 in backend.freed
    rest = run_all(queue)
    assert [o.request_id for o in rest] == ["late"] and rest[0].error is None
    queue.add(request("after", [1, 2]))
    (after,) = run_all(queue)
    assert after.error is None


def test_abort_drops_waiting_and_running_inputs_without_an_outcome() -> None:
    queue, backend = make_queue(max_batch_tokens=4)
    queue.add(request("gone", list(range(1, 11)), [5, 5, 5, 5, 5]))
    queue.add(request("kept", [3, 4]))
    queue.step()  # "gone" input 0 is running (4 of 10 tokens done)
    queue.abort(["gone", "unknown"])
    assert 0 in backend.freed
    outcomes = run_all(queue)
    assert [o.request_id for o in outcomes] == ["kept"]
    assert all(5 not in t for batch in backend.batches[1:] for _, t, _, _ in batch)


@pytest.mark.parametrize(
    ("inputs", "problem"),
    [
        ([], "no inputs to embed"),
        ([[1], []], "input 1 is empty"),
        ([list(range(1, 66))], "input 0 has 65 tokens; the limit is 64"),
        ([[1, 1000]], "input 0 has a token id outside the vocabulary of 1000"),
        ([[-1]], "input 0 has a token id outside the vocabulary of 1000"),
    ],
)
def test_inputs_that_can_never_run_fail_at_once(inputs, problem) -> None:
    queue, backend = make_queue()
    (outcome,) = queue.add(request("x", *inputs))
    assert (outcome.request_id, outcome.error, outcome.vectors) == ("x", problem, None)
    assert not queue.has_work() and backend.batches == []


def test_a_duplicate_request_id_is_refused() -> None:
    queue, _ = make_queue()
    assert queue.add(request("x", [1])) == []
    (outcome,) = queue.add(request("x", [2]))
    assert outcome.error == "duplicate request id x"


def test_a_backend_that_cannot_split_takes_whole_inputs() -> None:
    queue, backend = make_queue(splits_sequences=False, max_batch_tokens=8)
    (too_long,) = queue.add(request("long", list(range(1, 10))))
    assert too_long.error == "input 0 has 9 tokens; the limit is 8"
    queue.add(request("r", [1] * 5, [2] * 5))
    (outcome,) = run_all(queue)
    assert [[len(t) for _, t, _, _ in batch] for batch in backend.batches] == [[5], [5]]
    assert outcome.error is None


def test_the_backend_is_built_on_the_first_request_and_a_failed_build_fails_it() -> None:
    calls: list[int] = []

    def broken() -> FakeEmbeddingBackend:
        calls.append(1)
        raise ModelLoadError("no memory for the embedding context")

    queue = EmbedQueue(broken)
    assert calls == [] and queue.step() == []
    (outcome,) = queue.add(request("x", [1]))
    assert outcome.error == "no memory for the embedding context"
    assert calls == [1] and not queue.has_work()


def test_close_frees_the_backend() -> None:
    queue, backend = make_queue()
    queue.close()
    assert not backend.closed  # never built: nothing to free
    queue.add(request("x", [1]))
    queue.close()
    assert backend.closed


def test_embed_messages_survive_the_wire() -> None:
    sent = EmbedRequest(request_id="e1", inputs=[[1, 2], [3]], normalize=False)
    assert decode_input(encode(sent)) == sent
    vectors = np.arange(6, dtype="<f4").reshape(2, 3)
    result = EmbedResult(
        worker_id=0, generation=2, request_id="e1", embeddings=vectors.tobytes(), n_embd=3
    )
    received = decode_output(encode(result))
    assert received == result
    assert isinstance(received, EmbedResult)
    decoded = np.frombuffer(received.embeddings, dtype="<f4").reshape(-1, received.n_embd)
    np.testing.assert_array_equal(decoded, vectors)


def test_a_pass_beside_generations_takes_at_most_its_budget() -> None:
    queue, backend = make_queue(max_batch_tokens=16, n_seq_max=4, max_seq_tokens=64)
    queue.add(request("r", [1] * 12, [2] * 12))
    queue.step(max_tokens=5)
    assert sum(len(t) for _, t, _, _ in backend.batches[0]) == 5
    (outcome,) = run_all(queue)
    np.testing.assert_allclose(outcome.vectors[1], unit(mean_vector([2] * 12)), rtol=1e-6)


def test_a_backend_that_cannot_split_still_takes_one_whole_input() -> None:
    queue, backend = make_queue(max_batch_tokens=16, splits_sequences=False)
    queue.add(request("r", [1] * 12, [2] * 3))
    queue.step(max_tokens=4)
    assert [len(t) for _, t, _, _ in backend.batches[0]] == [12]  # alone, whole
    assert len(run_all(queue)) == 1


def test_a_small_request_is_not_starved_by_a_large_one() -> None:
    """2,048 inputs in arrival order would make a later one-input request wait for all of
    them; with shares of the sequences and turns at each pass it finishes within a few
    passes while the large one is still far from done."""
    queue, backend = make_queue(max_batch_tokens=16, n_seq_max=4, max_seq_tokens=64)
    queue.add(request("large", *[[3] * 10 for _ in range(200)]))
    for _ in range(3):
        queue.step(max_tokens=8)
    queue.add(request("small", [7] * 10))
    finished: list[str] = []
    passes = 0
    while "small" not in finished and passes < 50:
        passes += 1
        finished += [o.request_id for o in queue.step(max_tokens=8)]
    assert finished == ["small"] and passes <= 12
    assert queue.has_work()  # the large one goes on


def test_a_pass_limited_by_time_fits_the_measured_speed() -> None:
    queue, backend = make_queue(max_batch_tokens=16)
    queue.add(request("r", [1] * 12, [2] * 12))
    queue.step(max_tokens=2)  # measures the speed
    assert queue.seconds_per_token is not None
    queue.seconds_per_token = 0.01  # as if a token took 10 ms
    queue.step(max_seconds=0.05)
    assert sum(len(t) for _, t, _, _ in backend.batches[1]) == 5
    queue.step(max_seconds=0.001)  # less than one token's time: a minimum still runs
    assert sum(len(t) for _, t, _, _ in backend.batches[2]) == MIN_PASS_TOKENS
