"""The step's `llama_batch`: rows sorted by sequence id, logits rows reported per chunk.

With a KV stream per sequence, llama.cpp cuts a batch into one ubatch (one pass over the
weights) per run of consecutive sequence ids in batch order; a 16-row decode step in
admission order [1, 2, 7, 6, 0, ...] took 1.7× (SmolLM2) to 2.9× (Gemma 3) the sorted
step's time (BENCHMARKS.md, fifteenth session). Pure logic over numpy buffers: no model.
"""

from __future__ import annotations

from inferflux.engine.backends.llama_cpp import _NumpyBatch


def test_rows_are_laid_out_by_sequence_id_and_reported_in_chunk_order() -> None:
    batch = _NumpyBatch(16)
    chunks = [(7, [70], 5, 1), (2, [20, 21, 22], 0, 1), (5, [50], 9, 0), (0, [1, 2], 3, 2)]
    rows = batch.fill(chunks)
    n = batch.struct.n_tokens
    assert n == 7
    assert batch.seq_id[:n].tolist() == [0, 0, 2, 2, 2, 5, 7]
    assert batch.token[:n].tolist() == [1, 2, 20, 21, 22, 50, 70]
    assert batch.pos[:n].tolist() == [3, 4, 0, 1, 2, 9, 5]
    assert batch.logits[:n].tolist() == [1, 1, 0, 0, 1, 0, 1]
    # per chunk, as given: the row of its last token's logits, -1 where it asked for none
    assert rows == [6, 4, -1, 1]


def test_chunks_of_one_sequence_keep_their_order() -> None:
    batch = _NumpyBatch(8)
    rows = batch.fill([(3, [30], 0, 1), (1, [10], 0, 1), (3, [31], 1, 1)])
    assert batch.token[:3].tolist() == [10, 30, 31]
    assert rows == [1, 0, 2]
