"""Speculative drafts in the token budget: `DraftProposer` and `attach_drafts`.

Owns: which decoding chunks of a step carry a draft, and the budget and KV rules for
them. A draft rides on a decoding chunk (the request's latest sampled token) as extra
rows, each with logits, so one `llama_decode` verifies it inside the continuous batch.
Rules: drafts use only the budget left after decoding rows and prompt chunks (they never
delay a prompt); a request's draft never writes beyond the KV cells it reserved at
admission (prompt + max_tokens), nor drafts tokens it could not emit. Does not own what
a draft is (engine/speculative.py proposes, EngineCore verifies). Pure logic.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from inferflux.scheduler.request import Request, RequestId, ScheduledChunk


class DraftProposer(Protocol):
    """Proposes draft tokens for decoding requests (engine/speculative.py)."""

    def propose(
        self, requests: list[Request], budget: int, max_cost: float = 0.0
    ) -> dict[RequestId, list[int]]:
        """Up to `budget` tokens in all, for some of `requests` (may mutate own state);
        with `max_cost` > 0, no more rows than keep the step within `max_cost` times the
        cost of its decode rows alone."""
        ...


def _decoding(chunk: ScheduledChunk) -> bool:
    request = chunk.request
    return (
        chunk.sample
        and len(chunk.token_ids) == 1
        and chunk.start_pos >= request.num_prompt_tokens
        and not chunk.draft_token_ids
    )


def attach_drafts(
    chunks: list[ScheduledChunk], proposer: DraftProposer, budget: int, max_cost: float = 0.0
) -> int:
    """Replace decoding chunks of `chunks` (in place) by drafted ones; returns the budget
    left. Each draft is capped so the request can still emit every drafted token plus
    the one sampled after them (`max_tokens - len(output) - 1`), which also keeps its KV
    positions inside its reservation. `max_cost` > 0: the step's cost bound relative to
    its decode rows alone (`DraftProposer.propose`)."""
    decoding = [i for i, c in enumerate(chunks) if _decoding(c)]
    if not decoding or budget <= 0:
        return budget
    drafts = proposer.propose([chunks[i].request for i in decoding], budget, max_cost)
    for i in decoding:
        request = chunks[i].request
        draft = drafts.get(request.request_id)
        if not draft:
            continue
        room = request.max_tokens - len(request.output_token_ids) - 1
        draft = draft[: min(room, budget)]
        if draft:
            chunks[i] = dataclasses.replace(chunks[i], draft_token_ids=tuple(draft))
            budget -= len(draft)
    return budget
