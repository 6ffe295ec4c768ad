"""ChunkEnvelope's pre-encoded chunk: the same bytes as encoding the whole chunk."""

from __future__ import annotations

import json

import pytest

from inferflux.api.openai.envelope import ChunkEnvelope, chat_chunk_choice
from inferflux.api.sse import sse_data


@pytest.mark.parametrize("include_usage", [False, True])
def test_chunk_bytes_equal_the_whole_chunk_encoded(include_usage: bool) -> None:
    envelope = ChunkEnvelope(
        'chatcmpl-"quoted"\\',
        "model/ü\u2028",
        "fp_1",
        object_names=("chat.completion", "chat.completion.chunk"),
        include_usage=include_usage,
    )
    choices = [chat_chunk_choice(0, {"content": 'a "b"\n\u2028é'}, None)]
    expected = envelope.body(choices, "chat.completion.chunk")
    if include_usage:
        expected["usage"] = None

    chunk = envelope.chunk(choices)

    assert chunk == sse_data(expected)
    assert json.loads(chunk.removeprefix(b"data: ")) == expected
