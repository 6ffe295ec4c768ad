"""`StreamBuffer`: tokens sent in chunks: `scheduler.stream_interval`, and every request
nobody streams.

Owns: holding a request's deltas back and merging them into one delta (text joined, token
ids and logprobs concatenated, counts from the latest): until it has `interval` new tokens
(the setting, for every request), or, for a request added with `hold_s` > 0 (a client that
reads nothing until the end: `stream: false`), until `hold_s` seconds passed since its
held tokens began. A request's first delta always goes out at once (time to first token,
and the API waits for it to open the response) and so does its last (a finish reason
flushes what was held). Does not own: when the worker sends (worker.py) or what the deltas
say (core.py).

Why: each delta the worker sends costs a message, an event-loop wake-up and an SSE event
in the API process; on a machine whose cores llama.cpp's threads fill, that CPU comes out
of decoding (BENCHMARKS.md, "stream_interval"). vLLM and SGLang offer the same trade as
`--stream-interval`. With interval 1 (the default) a streamed request's deltas pass
untouched. A collected request's tokens still leave every `hold_s` (not only at its end)
so that what reads them on the way keeps up: the rate limiter's completion charges, the
output guardrails (a block ends the request within `hold_s`) and the live request view.

NOTE: a request paused by the scheduler (preempted, or yielding its timeslice) keeps up
to interval − 1 tokens until it resumes or finishes; a held request's go out by their
time at the worker's next turn.
"""

from __future__ import annotations

import time

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
    """The deltas to send now, of all a step produced, with `interval` tokens per delta
    (every `hold_s` seconds for the requests registered with `hold`)."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._held: dict[str, RequestDelta] = {}
        self._hold_s: dict[str, float] = {}  # request id: its hold (collected requests)
        self._due: dict[str, float] = {}  # held collected request: when its tokens go

    def hold(self, request_id: str, seconds: float) -> None:
        """Hold `request_id`'s tokens up to `seconds` each (its client collects them)."""
        self._hold_s[request_id] = seconds

    def take(self, deltas: list[RequestDelta], now: float | None = None) -> list[RequestDelta]:
        """What to send of `deltas` (and of what was held) at `now` (time.monotonic())."""
        if self.interval <= 1 and not self._hold_s:
            return deltas
        now = time.monotonic() if now is None else now
        out: list[RequestDelta] = []
        for produced in deltas:
            request_id = produced.request_id
            held = self._held.pop(request_id, None)
            delta = produced if held is None else merge_deltas(held, produced)
            # NOTE: its tokens are all it ever made: nothing was sent yet (the first token)
            first = delta.num_output_tokens <= len(delta.token_ids)
            hold_s = self._hold_s.get(request_id)
            if delta.finish_reason is not None:
                self._hold_s.pop(request_id, None)
                self._due.pop(request_id, None)
                out.append(delta)
            elif first:
                out.append(delta)
            elif hold_s is not None:
                due = self._due.setdefault(request_id, now + hold_s)
                if now >= due:
                    del self._due[request_id]
                    out.append(delta)
                else:
                    self._held[request_id] = delta
            elif len(delta.token_ids) >= self.interval:
                out.append(delta)
            else:
                self._held[request_id] = delta
        if self._due:
            for request_id in [r for r, due in self._due.items() if now >= due]:
                del self._due[request_id]
                out.append(self._held.pop(request_id))  # paused: no delta this step
        return out

    @property
    def num_held(self) -> int:
        """Requests with tokens held back now."""
        return len(self._held)
