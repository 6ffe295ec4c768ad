"""`StreamBuffer`: `scheduler.stream_interval`, the worker streaming tokens in chunks.

Owns: holding a request's deltas back until it has `interval` new tokens, and merging
them into one delta (text joined, token ids and logprobs concatenated, counts from the
latest). A request's first delta always goes out at once (time to first token) and so
does its last (a finish reason flushes what was held). Does not own: when the worker
sends (worker.py) or what the deltas say (core.py).

Why: each delta the worker sends costs a message, an event-loop wake-up and an SSE event
in the API process; on a machine whose cores llama.cpp's threads fill, that CPU comes out
of decoding (BENCHMARKS.md, "stream_interval"). vLLM and SGLang offer the same trade as
`--stream-interval`. With interval 1 (the default) every delta passes untouched.

NOTE: a request paused by the scheduler (preempted, or yielding its timeslice) keeps up
to interval − 1 tokens until it resumes or finishes.
"""

from __future__ import annotations

import msgspec

from inferflux.engine.messages import RequestDelta


def merge_deltas(earlier: RequestDelta, later: RequestDelta) -> RequestDelta:
    """One delta saying what `earlier` and then `later` said (both of one request)."""
    logprobs = None
    if earlier.logprobs is not None or later.logprobs is not None:
        logprobs = [*(earlier.logprobs or []), *(later.logprobs or [])]
    prompt_logprobs = earlier.prompt_logprobs
    if prompt_logprobs is None:
        prompt_logprobs = later.prompt_logprobs
    return msgspec.structs.replace(
        later,
        text=earlier.text + later.text,
        token_ids=[*earlier.token_ids, *later.token_ids],
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


class StreamBuffer:
    """The deltas to send now, of all a step produced, with `interval` tokens per delta."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._held: dict[str, RequestDelta] = {}

    def take(self, deltas: list[RequestDelta]) -> list[RequestDelta]:
        if self.interval <= 1:
            return deltas
        out: list[RequestDelta] = []
        for produced in deltas:
            held = self._held.pop(produced.request_id, None)
            delta = produced if held is None else merge_deltas(held, produced)
            # NOTE: its tokens are all it ever made: nothing was sent yet (the first token)
            first = delta.num_output_tokens <= len(delta.token_ids)
            if first or delta.finish_reason is not None or len(delta.token_ids) >= self.interval:
                out.append(delta)
            else:
                self._held[produced.request_id] = delta
        return out

    @property
    def num_held(self) -> int:
        """Requests with tokens held back now."""
        return len(self._held)
