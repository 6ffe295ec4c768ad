"""Verifying a speculative draft against the target rows of one `llama_decode`.

Owns: the verification walk (sample row i with the request's own sampler, accept while
the sample equals draft token i, emit every sampled token, stop at the first mismatch or
finish) and merging the per-token deltas of one step into the request's one delta.
Does not own sampling or finishing (EngineCore passes `sample_at`, which is its normal
per-token path: EOG, stop strings, max_tokens, grammar completion, logprobs of the
target row) or the KV trim (EngineCore, after the walk). Why the walk keeps the output
distribution: engine/speculative.py's module docstring and docs/speculative.md.
"""

from __future__ import annotations

from collections.abc import Callable

from inferflux.engine.messages import RequestDelta
from inferflux.scheduler import ScheduledChunk


def verify_draft(
    chunk: ScheduledChunk, row: int, sample_at: Callable[[int], RequestDelta]
) -> tuple[list[RequestDelta], int]:
    """Walk the draft of `chunk`, whose last logits row is `row` (the rows of the fed
    token and every draft token are consecutive). `sample_at(row)` samples and emits one
    token (appending it to the request's output) and returns its delta.

    Mutates `chunk.request.num_computed_tokens`: the caller has counted the fed token;
    each draft token whose KV turns out valid (it equals the token sampled before it) is
    counted here. Returns the deltas (one per emitted token) and the number of draft
    tokens accepted (emitted as sampled)."""
    draft = chunk.draft_token_ids
    first = row - len(draft)
    request = chunk.request
    deltas: list[RequestDelta] = []
    accepted = 0
    for i in range(len(draft) + 1):
        if i > 0:
            request.num_computed_tokens += 1  # draft[i - 1] was sampled: its KV holds
        delta = sample_at(first + i)
        deltas.append(delta)
        if i == len(draft) or delta.token_ids != [draft[i]]:
            break
        accepted += 1
        if delta.finish_reason is not None:
            break
    return deltas, accepted


def merge_deltas(deltas: list[RequestDelta]) -> RequestDelta:
    """One delta for consecutive deltas of one request (texts and tokens joined; counts,
    finish and error from the last; prompt logprobs from the first that has them)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    logprobs = [lp for d in deltas for lp in d.logprobs or []]
    prompt_logprobs = next((d.prompt_logprobs for d in deltas if d.prompt_logprobs), None)
    return RequestDelta(
        request_id=last.request_id,
        text="".join(d.text for d in deltas),
        token_ids=[t for d in deltas for t in d.token_ids],
        finish_reason=last.finish_reason,
        num_prompt_tokens=last.num_prompt_tokens,
        num_output_tokens=last.num_output_tokens,
        num_cached_tokens=last.num_cached_tokens,
        error=last.error,
        error_code=last.error_code,
        stop_sequence=last.stop_sequence,
        logprobs=logprobs if any(d.logprobs is not None for d in deltas) else None,
        prompt_logprobs=prompt_logprobs,
        num_draft_tokens=last.num_draft_tokens,
        num_draft_accepted=last.num_draft_accepted,
    )
