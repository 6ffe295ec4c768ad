"""The parts every OpenAI completion body and SSE chunk share: id, object, created, model,
system_fingerprint, and `usage`.

Owns `usage_body` (the service's `Usage` with OpenAI's `prompt_tokens_details` /
`completion_tokens_details`) and `ChunkEnvelope`. Does not own the choices inside (chat
and completions build their own).
"""

from __future__ import annotations

import time

import msgspec

from inferflux.api.generation import Usage
from inferflux.api.sse import sse_data

_encoder = msgspec.json.Encoder()


def usage_body(usage: Usage) -> dict[str, object]:
    """OpenAI's `usage` object. Speculative decoding reports as Predicted Outputs do:
    drafted tokens that made it into the output are `accepted_prediction_tokens`, the
    others `rejected_prediction_tokens` (docs/speculative.md)."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": usage.draft_accepted_tokens,
            "rejected_prediction_tokens": usage.draft_tokens - usage.draft_accepted_tokens,
        },
    }


class ChunkEnvelope:
    """The fields every body and SSE chunk of one response share, and the usage chunk."""

    def __init__(
        self,
        response_id: str,
        model: str,
        system_fingerprint: str,
        *,
        object_names: tuple[str, str],
        include_usage: bool,
    ) -> None:
        """`object_names`: (the full response's `object`, each chunk's `object`)."""
        self.response_id = response_id
        self.model = model
        self.system_fingerprint = system_fingerprint
        self.response_object, self.chunk_object = object_names
        self.include_usage = include_usage
        self.created = int(time.time())
        # NOTE: one chunk per streamed token; the fields before `choices` (and after it)
        # never change within a response, so they are encoded once and only the choices
        # are encoded per chunk (the bytes are those of `sse_data(body(...))`).
        head = self.body([], self.chunk_object)
        del head["choices"]
        self._chunk_prefix = b"data: " + _encoder.encode(head)[:-1] + b',"choices":'
        self._chunk_suffix = b',"usage":null}\n\n' if include_usage else b"}\n\n"

    def body(self, choices: list[dict[str, object]], object_name: str) -> dict[str, object]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        }

    def chunk(self, choices: list[dict[str, object]]) -> bytes:
        """One SSE event; `usage: null` when the client asked for a usage chunk at the end."""
        return self._chunk_prefix + _encoder.encode(choices) + self._chunk_suffix

    def usage(self, usage: Usage) -> bytes:
        """The final usage event: empty choices (OpenAI's `stream_options.include_usage`)."""
        return sse_data({**self.body([], self.chunk_object), "usage": usage_body(usage)})

    def full_response(self, choices: list[dict[str, object]], usage: Usage) -> dict[str, object]:
        return {**self.body(choices, self.response_object), "usage": usage_body(usage)}


def chat_chunk_choice(
    index: int, delta: dict[str, object], finish_reason: str | None, logprobs: object = None
) -> dict[str, object]:
    """One choice of a `chat.completion.chunk` (plain chat and tool calls alike)."""
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
