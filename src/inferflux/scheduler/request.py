"""Engine-side request state and the per-step contract `SchedulerOutput`.

The API never sees a `Request`: it sees `RequestDelta`s. Token accounting follows one
rule: `num_computed_tokens` tokens of `all_token_ids` have KV in the sequence; the rest
(prompt chunks not prefilled yet, or the latest sampled token) are fed by later steps.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import NewType

RequestId = NewType("RequestId", str)
SeqId = NewType("SeqId", int)


class RequestStatus(enum.IntEnum):
    """Lifecycle. Ordered: every status after RUNNING is terminal."""

    WAITING = 0
    RUNNING = 1
    FINISHED = 2


@dataclass(slots=True, eq=False)
class Request:
    """One generation request as the scheduler tracks it (mutable, hot)."""

    request_id: RequestId
    prompt_token_ids: list[int]
    max_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    seq_id: SeqId | None = None
    status: RequestStatus = RequestStatus.WAITING
    arrival_at: float = field(default_factory=time.monotonic)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """KV cells this request can ever hold: prompt plus max_tokens."""
        return len(self.prompt_token_ids) + self.max_tokens

    def tokens_to_compute(self, limit: int) -> list[int]:
        """The next at most `limit` tokens that have no KV yet."""
        start = self.num_computed_tokens
        end = min(self.num_tokens, start + limit)
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        generated = self.output_token_ids[max(start - n_prompt, 0) : end - n_prompt]
        return self.prompt_token_ids[start:n_prompt] + generated if start < n_prompt else generated


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """Tokens of one request fed to this step, from position `start_pos`."""

    request: Request
    seq_id: SeqId  # the request's sequence slot (every scheduled request has one)
    token_ids: list[int]
    start_pos: int
    sample: bool  # True when the chunk ends at the last known token: sample the next one


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What runs in one step: decode chunks first, then prompt chunks."""

    chunks: list[ScheduledChunk]
    num_tokens: int

    @property
    def empty(self) -> bool:
        return not self.chunks
