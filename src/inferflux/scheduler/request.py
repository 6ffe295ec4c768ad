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


class PriorityClass(enum.IntEnum):
    """Scheduling class; lower is served first. Aging lowers a waiting request's class."""

    HIGH = 0
    NORMAL = 1
    LOW = 2


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
    priority: PriorityClass = PriorityClass.NORMAL
    cache_namespace: str = ""  # prefix-cache namespace (tenant / adapter)
    use_prefix_cache: bool = True  # False when every prompt position must be computed
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    num_preemptions: int = 0  # > 0: it ran, gave its slot back, and waits to resume
    output_len_at_admit: int = 0  # len(output_token_ids) when last admitted (timeslices)
    num_draft_tokens: int = 0  # speculative tokens drafted for it, in all
    num_draft_accepted: int = 0  # of those, the ones verification accepted
    # [begin, end) of each image's embedding rows in the prompt (engine/image_prep.py):
    # a chunk never mixes them with text, and takes an image's rows whole
    image_spans: tuple[tuple[int, int], ...] = ()
    # disaggregated mode, decode side: the KV of this many prompt tokens arrives in a
    # hand-off ticket, hydrated at admission (KvHydrate) instead of computed; 0 = none
    ticket_tokens: int = 0
    # False: nobody reads its tokens before its end (AddRequest.hold_s), so stall-free
    # targets (scheduler.itl_target_*) do not hold prompts or drafts back for it
    streamed: bool = True

    @property
    def started(self) -> bool:
        """True once it has produced a token (a queue timeout no longer applies)."""
        return bool(self.output_token_ids) or self.num_preemptions > 0

    @property
    def tokens_since_admit(self) -> int:
        return len(self.output_token_ids) - self.output_len_at_admit

    def computed_token_ids(self) -> list[int]:
        """The tokens whose KV the request's sequence holds, in order."""
        n = self.num_computed_tokens
        n_prompt = len(self.prompt_token_ids)
        if n <= n_prompt:
            return self.prompt_token_ids[:n]
        return self.prompt_token_ids + self.output_token_ids[: n - n_prompt]

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
        if self.image_spans:
            end = _cut_at_images(self.image_spans, start, end)
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        generated = self.output_token_ids[max(start - n_prompt, 0) : end - n_prompt]
        return self.prompt_token_ids[start:n_prompt] + generated if start < n_prompt else generated


def _cut_at_images(spans: tuple[tuple[int, int], ...], start: int, end: int) -> int:
    """Where a chunk from `start` ends: the rest of an image it starts in (whole, even past
    the budget: a non-causal vision model needs an image in one batch), else before the
    next image it would reach."""
    for begin, stop in spans:
        if begin <= start < stop:
            return stop
        if start < begin < end:
            return begin
    return end


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """Tokens of one request fed to this step, from position `start_pos`."""

    request: Request
    seq_id: SeqId  # the request's sequence slot (every scheduled request has one)
    token_ids: list[int]
    start_pos: int
    sample: bool  # True when the chunk ends at the last known token: sample the next one
    # speculative tokens fed after `token_ids` (all with logits) to verify (scheduler/drafts.py)
    draft_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class KvCopy:
    """Make sequence `dst` hold the first `n_tokens` positions of sequence `src`."""

    src: SeqId
    dst: SeqId
    n_tokens: int
    request: Request | None = None  # set when the copy admits this request (a cache hit)


@dataclass(frozen=True, slots=True)
class KvFree:
    """Drop all KV of sequence `seq_id`."""

    seq_id: SeqId


@dataclass(frozen=True, slots=True)
class KvRestore:
    """Load lower-tier cache entry `key` into sequence `dst`, cut to `n_tokens` (a hit in
    the host or disk tier: scheduler/lower_tiers.py)."""

    key: str
    dst: SeqId
    n_tokens: int
    request: Request


@dataclass(frozen=True, slots=True)
class KvHydrate:
    """Load the request's hand-off ticket (its first `n_tokens` prompt positions, written
    by a prefill worker: engine/kv_channel.py) into sequence `dst`."""

    dst: SeqId
    n_tokens: int
    request: Request


@dataclass(frozen=True, slots=True)
class KvKeep:
    """Keep the first `n_tokens` positions of sequence `seq_id` and drop the rest: the
    request continues a prefix parked in its slot (scheduler/parking.py), in place."""

    seq_id: SeqId
    n_tokens: int
    request: Request


@dataclass(frozen=True, slots=True)
class KvMove:
    """Make sequence `dst` hold the first `n_tokens` positions of the prefix parked in
    `src`, by serializing it: this costs what its tokens hold, where a copy across KV
    streams (`KvCopy`) moves every cell of the context. `src` keeps its KV. The request
    runs in `dst` because `src` would leave a gap among the running slots."""

    src: SeqId
    dst: SeqId
    n_tokens: int
    request: Request


@dataclass(frozen=True, slots=True)
class KvSave:
    """Serialize sequence `seq_id`, which holds `token_ids` of `namespace`, into the lower
    tiers (engine/kv_offload.py): a parked prefix that a request displaces. Costs what
    the tokens hold, where a copy into a cache slot moves the whole context's cells."""

    seq_id: SeqId
    namespace: str
    token_ids: list[int]


KvOp = KvCopy | KvFree | KvRestore | KvHydrate | KvKeep | KvMove | KvSave


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What runs in one step: KV operations first (in order, before the decode), then
    decode chunks, then prompt chunks. `timed_out` requests left the queue unrun."""

    chunks: list[ScheduledChunk]
    num_tokens: int
    kv_ops: list[KvOp] = field(default_factory=list)
    timed_out: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    wait_s: float = 0.0  # > 0: nothing runs yet (batching window); ask again after this

    @property
    def empty(self) -> bool:
        return not self.chunks
