"""Continuous batching: which tokens of which requests go into the next engine step.

Owns: the waiting queues (high, normal, low; FIFO within each, with aging), the running
set, sequence-slot allocation, unified-KV cell reservation, queue timeouts, the batching
window, fairness (timeslice yields and priority preemption), and the prefix cache
bookkeeping (which KV copies a hit, a preemption or a finish needs). Pure logic: no
llama.cpp, no I/O; tests call `schedule()` with a clock of their own and check the exact
state after every step.

There are no prefill and decode phases. Each step has a token budget
(`max_batch_tokens`); every running request that has sampled a token feeds it (one
token each, first, so inter-token latency stays flat), then prompts still being
prefilled get chunks, then waiting requests are admitted while a sequence slot, budget
and KV cells remain. A request's computed-token count catches up with its length.

Stall-free steps. With `itl_target_s` (or `itl_target_ratio`, a multiple of the step's
decode rows alone) set and streamed sequences decoding (`Request.streamed`: a collected
request's tokens wait for its end anyway), the prompt tokens of a step are capped so
that its expected time (`StepCostModel`, learned from every step) stays under the
target: a long prompt is prefilled over several short steps instead of freezing every
stream for one long step (Sarathi-Serve's stall-free batching). Prompts still progress
by at least `MIN_PROMPT_CHUNK` tokens a step, and with nothing decoding a prompt takes
the whole budget (stall_free.py).

Prompt bursts. With `burst_stall_s` and no stall-free target, the streams below the HIGH
class stand aside while prompts are prefilled (up to `burst_stall_s`), so each pauses once
per burst of arrivals instead of once per prompt step: the same delay in fewer, longer
gaps. A burst's first step admits every waiting request that fits (in rank order); its
prompts go shortest first (those that waited `aging_s` go first, by arrival plus their
prompt's expected time: shortest first again among prompts that arrived together), and a
step ends where a prompt ends when `StepCostModel.split_pays` (the first token earlier
against a step's fixed cost for each prompt after it).

High priority first. A HIGH-class prompt is never capped: it takes what the step's budget
has left after the decodes. While HIGH-class requests keep arriving (one in the last
`_HIGH_TRAFFIC_S`), the other prompts carry at most `high_traffic_chunk_tokens` a step,
so a step that EngineCore stops for a HIGH arrival (`interrupt_steps`) loses less, and
one it does not stop is shorter to wait out. While a HIGH prompt is being prefilled, or
waits at the head of its queue and can be admitted, the other prompts carry no tokens,
and with `high_prefill_alone` the step that ends it carries nothing of lower classes
either, decode rows or prompt chunks: that step is as short as it can be, and its first
token comes one step after it arrives (the streams wait that one step). A prompt that
has aged to the HIGH class (below) does not stand aside in the other steps, which keeps
the starvation bound, but beside a HIGH prompt it carries only `MIN_PROMPT_CHUNK`
tokens a step: aged prompts rank ahead of a new HIGH one, and taking whole steps they
made its first token wait (priority bench: a high request admitted at once, its first
token after 0.77 s).

Admission order. The head of each class queue competes on (effective class, arrival),
where a request's effective class drops by one for every `aging_s` it has waited. So a
LOW request waits at most `2 * aging_s` before it is ordered purely by arrival among
HIGH requests: no request that arrived after it is admitted before it from then on
(the starvation bound, tested).

Fairness. When a waiting request cannot be admitted (no slot, or no KV cells):
- with `enable_preemption`, a waiting request of class `high_priority_threshold` or
  better preempts the newest running request of a worse class (a preemption), and takes
  its slot even when an aged request ranks ahead of it (it is admitted into that slot
  at once: the victim, aged itself, would otherwise take it straight back, and an aged
  head that can be admitted leaves it no free slot); a request that was preempted
  before is safe until it has produced `_MIN_RUN_TOKENS` since it resumed, and a prompt
  still being prefilled goes only when no decoding request can;
- otherwise a running request of a worse class that produced `max_timeslice_tokens`
  since its admission gives its slot back (a yield).
Either way its KV is first copied into the prefix cache (or parked), it returns to the
front of its queue with its tokens and sampler state, and on resume only what the cache
lost is recomputed: nothing is lost or repeated.
Parked slots (`park`): a finished request's KV stays in its slot (scheduler/parking.py).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable

from inferflux.scheduler.drafts import DraftProposer, attach_drafts
from inferflux.scheduler.lower_tiers import LowerTiers
from inferflux.scheduler.parking import ParkedSlots, claimed_slots, packed_slot
from inferflux.scheduler.policy import FairnessCounters, SchedulingPolicy
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import (
    KvCopy,
    KvFree,
    KvHydrate,
    KvKeep,
    KvMove,
    KvOp,
    KvRestore,
    KvSave,
    PriorityClass,
    Request,
    RequestId,
    RequestStatus,
    ScheduledChunk,
    SchedulerOutput,
    SeqId,
)
from inferflux.scheduler.stall_free import (
    PromptAllowance,
    draft_cost_bound,
    prompt_share,
    step_target_s,
)
from inferflux.scheduler.step_cost import StepCostModel

_MIN_RUN_TOKENS = 16  # a resumed request runs this long before it can be preempted again
_TIMEOUT_SCAN_S = 0.1
# A HIGH-class arrival within this many seconds caps the other prompts' chunks
# (`high_traffic_chunk_tokens`).
_HIGH_TRAFFIC_S = 30.0


class Scheduler:
    """Priority continuous-batching scheduler. Not thread-safe: one engine thread owns it."""

    def __init__(
        self,
        *,
        max_num_seqs: int,
        max_batch_tokens: int,
        kv_capacity: int | None,
        policy: SchedulingPolicy | None = None,
        prefix_cache: PrefixCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        park: bool = False,
    ) -> None:
        """`kv_capacity`: cells shared by all running sequences (unified KV), or None
        when each sequence slot has a full context of its own. Running requests use
        slots 0..max_num_seqs-1; the prefix cache's slots are its own. `park`: leave
        finished requests' KV in their slots (with the prefix cache, per-sequence KV)."""
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.kv_capacity = kv_capacity
        self.policy = policy or SchedulingPolicy()
        self.prefix_cache = prefix_cache
        self.clock = clock
        self.parked: ParkedSlots | None = None
        if park and prefix_cache is not None and kv_capacity is None:
            self.parked = ParkedSlots(prefix_cache.min_match)
        self.counters = FairnessCounters()
        self.step_cost = StepCostModel()  # fed by EngineCore with every step's time
        self.memory_pressure = False  # set by EngineCore: half admissions and budget
        self.queues: dict[PriorityClass, deque[Request]] = {p: deque() for p in PriorityClass}
        self.running: list[Request] = []
        self._requests: dict[RequestId, Request] = {}
        self._free_seq_ids: list[int] = list(range(max_num_seqs))
        self._reserved_cells = 0
        self._last_timeout_scan = float("-inf")
        self.lower_tiers: LowerTiers | None = None  # host/disk tiers (engine/kv_offload.py)
        self.draft_proposer: DraftProposer | None = None  # speculative decoding (drafts.py)
        self._high_seen_at = float("-inf")  # the latest HIGH-class arrival
        self._stood_aside = False  # the last planned step stood lower-class streams aside
        # the step just planned follows one that stood the streams aside: it must run
        # whole (EngineCore does not stop it), so they decode at least every other step
        self.after_aside = False
        self._burst_since: float | None = None  # when the streams began to stand aside

    # -- queries -------------------------------------------------------------------
    def get(self, request_id: RequestId) -> Request | None:
        return self._requests.get(request_id)

    def has_work(self) -> bool:
        return bool(self.running) or any(self.queues.values())

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def num_waiting_by_class(self) -> dict[PriorityClass, int]:
        return {p: len(q) for p, q in self.queues.items()}

    @property
    def waiting(self) -> list[Request]:
        """Every waiting request, in admission order if nothing ages meanwhile."""
        now = self.clock()
        pending = [r for q in self.queues.values() for r in q]
        return sorted(pending, key=lambda r: self._rank(r, now))

    def idle_wait_s(self) -> float:
        """Seconds until `schedule()` can run anything (the batching window), else 0."""
        return self._window_wait(self.clock())

    def can_ever_fit(self, request: Request) -> bool:
        """False when the request needs more KV cells than exist at all."""
        return self.kv_capacity is None or request.max_total_tokens <= self.kv_capacity

    # -- mutations -----------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request at the back of its class. Raises ValueError on a duplicate id."""
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id}")
        request.status = RequestStatus.WAITING
        self._requests[request.request_id] = request
        self.queues[request.priority].append(request)
        if request.priority == PriorityClass.HIGH:
            self._high_seen_at = self.clock()

    def finish(
        self, request_id: RequestId, *, cache: bool = False
    ) -> tuple[Request | None, list[KvOp]]:
        """Remove a request wherever it is. Returns it (None if unknown) and the KV
        operations to run now: with `cache`, a copy of its KV into the prefix cache, then
        freeing its slot."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return None, []
        ops: list[KvOp] = []
        if request.status == RequestStatus.RUNNING:
            ops = self._release(request, cache=cache)
        else:
            self.queues[request.priority].remove(request)
        request.status = RequestStatus.FINISHED
        return request, ops

    def _release(self, request: Request, *, cache: bool) -> list[KvOp]:
        """Take a running request off its slot; the KV ops that saves (opt.) and frees it."""
        self.running.remove(request)
        if self.kv_capacity is not None:
            self._reserved_cells -= request.max_total_tokens
        seq_id = request.seq_id
        if seq_id is None:
            return []
        heapq.heappush(self._free_seq_ids, seq_id)
        ops: list[KvOp] = []
        if cache and self.prefix_cache is not None and request.use_prefix_cache:
            tokens, space = request.computed_token_ids(), request.cache_namespace
            if self.parked is not None and self.parked.park(seq_id, space, tokens):
                return ops  # its KV stays where it is
            ops.extend(self._cache_insert(space, tokens, seq_id))
        ops.append(KvFree(seq_id))
        return ops

    def _cache_insert(
        self, namespace: str, tokens: list[int], seq_id: SeqId, protected: int = -1
    ) -> list[KvOp]:
        assert self.prefix_cache is not None
        inserted = self.prefix_cache.insert(namespace, tokens, protected=protected)
        if inserted is None:
            return []
        ops: list[KvOp] = [KvFree(SeqId(s)) for s in inserted.evicted if s != inserted.slot]
        ops.append(KvCopy(src=seq_id, dst=SeqId(inserted.slot), n_tokens=inserted.length))
        return ops

    def schedule(self) -> SchedulerOutput:
        """Pick this step's chunks (see the module docstring). Admits waiting requests."""
        now = self.clock()
        timed_out = self._expire(now)
        wait_s = self._window_wait(now)
        if wait_s > 0:
            return SchedulerOutput(chunks=[], num_tokens=0, timed_out=timed_out, wait_s=wait_s)
        kv_ops: list[KvOp] = []
        preempted = self._make_room(now, kv_ops)
        budget = self.max_batch_tokens // 2 if self.memory_pressure else self.max_batch_tokens
        chunks: list[ScheduledChunk] = []
        prefilling = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        high_first = self._high_first(prefilling)
        alone = high_first and not self._stood_aside and self._high_prompt_ends(prefilling, budget)
        self.after_aside, self._stood_aside = self._stood_aside, alone
        burst = not alone and self._in_burst(now, high_first, prefilling)
        if not (alone or burst):
            self._burst_since = None  # a burst, if any, has ended
        rows, aside = self._decoders(alone, burst)
        budget = self._decode_rows(rows, chunks, budget)
        if aside and self._burst_since is None:
            self._burst_since = now
        decoding, target_s = len(chunks), step_target_s(self.policy, self.step_cost, chunks)
        share = prompt_share(
            self.step_cost,
            self.max_batch_tokens,
            target_s,
            decoding,
            lambda: self._prompt_backlog(prefilling),
        )
        guard = self.policy.high_traffic_chunk_tokens
        if guard > 0 and self._high_traffic_at(now):
            share = min(share, guard)
        allowance = PromptAllowance(budget, share, high_first, alone)
        if burst:
            prompts = self._burst_chunks(prefilling, allowance, now, kv_ops)
        else:
            prompts = self._prompt_chunks(prefilling, allowance, now, kv_ops)
        if aside and not prompts:  # nothing to stand aside for after all
            self._burst_since = None
            budget = self._decode_rows(aside, chunks, budget)
            decoding = len(chunks)
            target_s = step_target_s(self.policy, self.step_cost, chunks)
        chunks.extend(prompts)
        budget -= allowance.taken
        if self.draft_proposer is not None:
            max_cost = draft_cost_bound(self.step_cost, target_s, decoding, allowance.taken)
            budget = attach_drafts(chunks, self.draft_proposer, budget, max_cost)
        return SchedulerOutput(
            chunks=chunks,
            num_tokens=self.max_batch_tokens - budget,
            kv_ops=kv_ops,
            timed_out=timed_out,
            preempted=preempted,
        )

    def _decoders(self, alone: bool, burst: bool) -> tuple[list[Request], list[Request]]:
        """The decoding requests that feed a token this step, and those that stand aside
        for a burst's prompts; with `alone`, those below HIGH are in neither (they stand
        aside for the step that gives a HIGH prompt its first token)."""
        rows: list[Request] = []
        aside: list[Request] = []
        for request in self.running:
            if request.num_computed_tokens < request.num_prompt_tokens:
                continue
            if request.priority == PriorityClass.HIGH or not (alone or burst):
                rows.append(request)
            elif burst:
                aside.append(request)
        return rows, aside

    def _decode_rows(
        self, requests: list[Request], chunks: list[ScheduledChunk], budget: int
    ) -> int:
        """One-token chunks of `requests` while the budget lasts; returns what is left."""
        for request in requests:
            if budget <= 0:
                break
            chunks.append(self._chunk(request, 1))
            budget -= 1
        return budget

    @property
    def high_traffic(self) -> bool:
        """A HIGH-class request arrived in the last `_HIGH_TRAFFIC_S`."""
        return self._high_traffic_at(self.clock())

    def _high_traffic_at(self, now: float) -> bool:
        return now - self._high_seen_at < _HIGH_TRAFFIC_S

    def observe_step(self, decoding: int, tokens: int, seconds: float) -> None:
        """A finished step's wall time: `decoding` one-token rows, `tokens` others."""
        self.step_cost.observe(decoding, tokens, seconds)

    def _prompt_chunks(
        self, prefilling: list[Request], allowance: PromptAllowance, now: float, kv_ops: list[KvOp]
    ) -> list[ScheduledChunk]:
        """Chunks of the prompts being prefilled (HIGH first), then of admitted waiting
        requests, while `allowance` lasts."""
        chunks: list[ScheduledChunk] = []
        for request in sorted(prefilling, key=lambda r: r.priority):
            limit = allowance.limit(request, self._rank(request, now)[0])
            if limit > 0:
                chunks.append(self._chunk(request, limit))
                allowance.take(len(chunks[-1].token_ids))
        while True:
            head = self._next_waiting(now)
            if allowance.alone and head is not None and head.priority != PriorityClass.HIGH:
                # an aged head waits this one step too: the HIGH one behind it is admitted
                high = self.queues[PriorityClass.HIGH]
                head = high[0] if high else None
            if head is None or not self._can_admit(head):
                break
            limit = allowance.limit(head, self._rank(head, now)[0])
            if limit <= 0:
                break
            self._admit(head, kv_ops)
            chunks.append(self._chunk(head, limit))
            allowance.take(len(chunks[-1].token_ids))
        return chunks

    def _in_burst(self, now: float, high_first: bool, prefilling: list[Request]) -> bool:
        """With `burst_stall_s`: whether this step is one of a prompt burst, i.e. carries
        prompt tokens that the streams below the HIGH class stand aside for. Not while a
        HIGH prompt goes first or a stall-free target is set (those keep the streams
        decoding every step), and not once the streams have stood aside `burst_stall_s`
        (that step carries their tokens, and the next may begin a new burst)."""
        policy = self.policy
        if (
            policy.burst_stall_s <= 0
            or high_first
            or policy.itl_target_s > 0
            or policy.itl_target_ratio > 0
        ):
            return False
        if not prefilling:
            head = self._next_waiting(now)
            if head is None or not self._can_admit(head):
                return False
        return self._burst_since is None or now - self._burst_since < policy.burst_stall_s

    def _burst_chunks(
        self, prefilling: list[Request], allowance: PromptAllowance, now: float, kv_ops: list[KvOp]
    ) -> list[ScheduledChunk]:
        """A burst step's prompt chunks: every waiting request that fits is admitted
        first (in rank order), then the prompts go shortest first (those that have waited
        `aging_s` go before the others, by arrival plus their remaining tokens' time:
        their arrival order, but shortest first among prompts that came together), and
        the step ends where a prompt ends when the cost model says the earlier first
        token is worth a step's fixed cost to each prompt after it (on a CPU, where a
        token costs milliseconds, it is; on a GPU, where a step's tokens come almost
        free, it is not)."""
        pending = list(prefilling)
        while (head := self._next_waiting(now)) is not None and self._can_admit(head):
            self._admit(head, kv_ops)
            pending.append(head)
        aging, token_s = self.policy.aging_s, self.step_cost.token_cost_s

        def order(request: Request) -> tuple[int, bool, float, float]:
            remaining, arrival = (
                request.num_prompt_tokens - request.num_computed_tokens,
                request.arrival_at,
            )
            if aging > 0 and now - arrival >= aging:
                # by when it would be in had it started on arrival: by arrival where
                # arrivals are further apart than their prompts take, shortest first
                # where they came together (a wave of 32 clients ages as one)
                return request.priority, False, arrival + remaining * token_s, arrival
            return request.priority, True, remaining, arrival

        pending.sort(key=order)
        chunks: list[ScheduledChunk] = []
        for i, request in enumerate(pending):
            limit = allowance.limit(request, self._rank(request, now)[0])
            if limit <= 0:
                break
            chunks.append(self._chunk(request, limit))
            allowance.take(len(chunks[-1].token_ids))
            if chunks[-1].sample and i + 1 < len(pending):
                later = pending[i + 1 :]
                following = min(
                    allowance.limit(later[0], self._rank(later[0], now)[0]),
                    sum(r.num_prompt_tokens - r.num_computed_tokens for r in later),
                )
                if self.step_cost.split_pays(following, len(later)):
                    break
        return chunks

    def _high_first(self, prefilling: list[Request]) -> bool:
        """A HIGH-class prompt is being prefilled, or heads its queue and fits now."""
        if any(r.priority == PriorityClass.HIGH for r in prefilling):
            return True
        queue = self.queues[PriorityClass.HIGH]
        return bool(queue) and self._can_admit(queue[0])

    def _high_prompt_ends(self, prefilling: list[Request], budget: int) -> bool:
        """With `high_prefill_alone`: whether this step can end a HIGH prompt (one being
        prefilled, else the head of the HIGH queue), so its decode rows of lower classes
        may stand aside. Only that step: a long HIGH prompt's earlier chunks run beside
        the streams, so they wait one step per HIGH request at most."""
        if not self.policy.high_prefill_alone:
            return False
        high = [r for r in prefilling if r.priority == PriorityClass.HIGH]
        if not high and self.queues[PriorityClass.HIGH]:
            high = [self.queues[PriorityClass.HIGH][0]]
        return any(r.num_prompt_tokens - r.num_computed_tokens <= budget for r in high)

    def _prompt_backlog(self, prefilling: list[Request]) -> int:
        """Prompt tokens still to compute: of the prompts being prefilled, and of the
        waiting requests that have a free slot to go to."""
        backlog = sum(r.num_prompt_tokens - r.num_computed_tokens for r in prefilling)
        room = len(self._free_seq_ids)
        for queue in self.queues.values():
            for request in queue:
                if room <= 0:
                    return backlog
                backlog += request.num_prompt_tokens
                room -= 1
        return backlog

    # -- admission -----------------------------------------------------------------
    def _rank(self, request: Request, now: float) -> tuple[int, float]:
        aging = self.policy.aging_s
        steps = int((now - request.arrival_at) / aging) if aging > 0 else 0
        return max(0, request.priority - steps), request.arrival_at

    def _next_waiting(self, now: float) -> Request | None:
        heads = [q[0] for q in self.queues.values() if q]
        return min(heads, key=lambda r: self._rank(r, now)) if heads else None

    def _can_admit(self, request: Request) -> bool:
        if not self._free_seq_ids:
            return False
        if self.memory_pressure and len(self.running) >= max(1, self.max_num_seqs // 2):
            return False
        if self.kv_capacity is None:
            return True
        return self._reserved_cells + request.max_total_tokens <= self.kv_capacity

    def _admit(self, request: Request, kv_ops: list[KvOp]) -> None:
        self.queues[request.priority].remove(request)
        seq_id, kept = self._slot_for(request, kv_ops)
        request.seq_id = seq_id
        request.status = RequestStatus.RUNNING
        request.output_len_at_admit = len(request.output_token_ids)
        request.num_computed_tokens = 0
        if request.num_preemptions:
            self.counters.resumes += 1
        if self.kv_capacity is not None:
            self._reserved_cells += request.max_total_tokens
        self.running.append(request)
        if kept:
            request.num_computed_tokens = kept
            if not request.num_preemptions:
                request.num_cached_tokens = min(kept, request.num_prompt_tokens)
        else:
            self._reuse_prefix(request, seq_id, kv_ops)

    def _slot_for(self, request: Request, kv_ops: list[KvOp]) -> tuple[SeqId, int]:
        """The request's slot, and how many of its leading tokens that slot holds already."""
        parked, cache = self.parked, self.prefix_cache
        # the request's tokens only matter where a prefix can be parked
        tokens = request.prompt_token_ids + request.output_token_ids if parked else []
        peek, claimed = None, self._claimed(request, tokens)
        if parked and cache is not None and request.use_prefix_cache and not request.ticket_tokens:
            limit = len(tokens) - 1  # the last token is computed: its logits give a sample
            space = request.cache_namespace
            free = [s for s in self._free_seq_ids if s not in claimed]
            found = parked.best(space, tokens, max_length=limit, free=free)
            peek = cache.peek(space, tokens, max_length=limit)
            tiers = self.lower_tiers  # a longer saved prefix is restored into a free slot
            if found and tiers and tiers.match(space, tokens, max_length=limit, have=found[1]):
                found = None  # (_reuse_prefix) rather than a shorter parked one continued
            if found is not None and found[1] >= (peek.length if peek else 0):
                entry, kept = found
                cache.count_hit(kept, len(entry.tokens))
                seq_id = self._take_slot(kv_ops, -1, claimed, entry.slot)
                if seq_id != entry.slot:  # where it leaves no gap among the running slots
                    kv_ops.append(KvMove(SeqId(entry.slot), seq_id, kept, request))
                    return seq_id, kept
                kv_ops.extend(self._unpark(seq_id, kept))
                kv_ops.append(KvKeep(seq_id, kept, request))
                return seq_id, kept
        return self._take_slot(kv_ops, peek.slot if peek else -1, claimed), 0

    def _claimed(self, request: Request, mine: list[int]) -> set[int]:
        """Parked slots a waiting request continues further than `request` (its tokens
        `mine`): left to it (parking.py `claimed_slots`)."""
        if not self.parked:
            return set()
        waiting = (r for q in self.queues.values() for r in q if r is not request)
        return claimed_slots(self.parked, mine, waiting, self._free_seq_ids)

    def _take_slot(
        self, kv_ops: list[KvOp], protected: int, claimed: set[int], parked_at: int = -1
    ) -> SeqId:
        """A free slot for a request: `parked_at` (its prefix is parked there) or the lowest,
        unless another packs the running slots better (`packed_slot`; a gap costs every
        step a pass: docs/engine-notes.md). Slots `claimed` by waiting requests only when no
        other is free. Another prefix parked in it is saved or dropped, never evicting cache
        entry `protected` (the one the request will copy)."""
        free = self._free_seq_ids
        usable = [s for s in free if s not in claimed or s == parked_at] or free
        prefer = parked_at if parked_at >= 0 else min(usable)
        running = {r.seq_id for r in self.running if r.seq_id is not None}
        seq_id = SeqId(packed_slot(running, usable, prefer))
        free.remove(seq_id)
        heapq.heapify(free)
        if seq_id != parked_at and self.parked and seq_id in self.parked:
            kv_ops.extend([*self._unpark(seq_id, 0, protected), KvFree(seq_id)])
        return seq_id

    def _unpark(self, seq_id: SeqId, kept: int, protected: int = -1) -> list[KvOp]:
        """Save `seq_id`'s parked prefix, of which `kept` tokens stay, if the rest is worth it."""
        assert self.parked is not None and self.prefix_cache is not None
        entry = self.parked.take(seq_id)
        if entry is None or len(entry.tokens) - kept < self.parked.min_match:
            return []
        if self.lower_tiers is not None:  # host RAM: a save costs what the tokens hold
            return [KvSave(seq_id, entry.namespace, entry.tokens)]
        return self._cache_insert(entry.namespace, entry.tokens, seq_id, protected)

    def drop_parked(self) -> list[int]:
        """Forget every parked prefix; returns the slots whose KV to free."""
        return self.parked.clear() if self.parked is not None else []

    def _reuse_prefix(self, request: Request, seq_id: SeqId, kv_ops: list[KvOp]) -> None:
        """On a prefix-cache hit, copy the cached KV into the request's slot, or restore
        it from a lower tier when that holds a longer prefix (and is worth it)."""
        if request.ticket_tokens:  # the prompt's KV arrives in a ticket (hand-off)
            kv_ops.append(KvHydrate(seq_id, request.ticket_tokens, request))
            request.num_computed_tokens = request.ticket_tokens
            request.ticket_tokens = 0  # once: a preempted request resumes like any other
            return
        cache = self.prefix_cache
        if cache is None or not request.use_prefix_cache:
            return
        tokens = request.prompt_token_ids + request.output_token_ids
        # At least one token must be computed: its logits give the next sample.
        match = cache.match(request.cache_namespace, tokens, max_length=len(tokens) - 1)
        hit = None
        if self.lower_tiers is not None:  # a longer prefix in host RAM or on disk?
            have = match.length if match is not None else 0
            hit = self.lower_tiers.match(
                request.cache_namespace, tokens, max_length=len(tokens) - 1, have=have
            )
        if hit is not None:
            kv_ops.append(KvRestore(hit.key, seq_id, hit.length, request))
            length = hit.length
        elif match is not None:
            kv_ops.append(KvCopy(SeqId(match.slot), seq_id, match.length, request=request))
            length = match.length
        else:
            return
        request.num_computed_tokens = length
        if not request.num_preemptions:
            request.num_cached_tokens = min(length, request.num_prompt_tokens)

    def cache_copy_failed(self, request: Request) -> None:
        """The KV copy of a hit failed: compute the request from scratch instead."""
        request.num_computed_tokens = 0
        request.num_cached_tokens = 0

    # -- timeouts and the batching window -------------------------------------------
    def _expire(self, now: float) -> list[Request]:
        """Drop never-started waiting requests older than the queue timeout."""
        timeout = self.policy.queue_timeout_s
        if timeout <= 0 or now - self._last_timeout_scan < _TIMEOUT_SCAN_S:
            return []
        self._last_timeout_scan = now
        expired: list[Request] = []
        for queue in self.queues.values():
            for request in [r for r in queue if not r.started and now - r.arrival_at > timeout]:
                queue.remove(request)
                del self._requests[request.request_id]
                request.status = RequestStatus.FINISHED
                expired.append(request)
        self.counters.timeouts += len(expired)
        return expired

    def _window_wait(self, now: float) -> float:
        """Seconds to hold admissions so arrivals can share a first batch (idle only)."""
        window = self.policy.batch_window_s
        if window <= 0 or self.running or not self.has_work():
            return 0.0
        if self.num_waiting >= self.max_num_seqs or self.queues[PriorityClass.HIGH]:
            return 0.0
        oldest = min(q[0].arrival_at for q in self.queues.values() if q)
        return max(0.0, oldest + window - now)

    # -- fairness ------------------------------------------------------------------
    def _make_room(self, now: float, kv_ops: list[KvOp]) -> list[Request]:
        """Preempt or yield running requests that block better waiting ones."""
        head = self._next_waiting(now)
        if head is None:
            return []
        preemptor = self._preemptor(head)
        # An aged head takes the free slot; a HIGH request behind it preempts for a slot
        # of its own when no second slot is free (priority bench: it waited ~1 s while
        # aged requests took every slot that freed up).
        behind = preemptor is not None and preemptor is not head
        admissible = self._can_admit(head)
        if admissible and (not behind or len(self._free_seq_ids) > 1):
            return []
        victim = self._victim(preemptor, _MIN_RUN_TOKENS, fresh=True) if preemptor else None
        if victim is not None:
            self.counters.preemptions += 1
        elif admissible:
            return []
        else:
            victim = self._victim(head, self.policy.max_timeslice_tokens)
            if victim is None:
                return []
            self.counters.yields += 1
            preemptor = None  # a yield: the slot goes to the head of the ranking
        kv_ops.extend(self._release(victim, cache=True))
        victim.seq_id = None
        victim.num_computed_tokens = 0  # its KV now lives in the prefix cache, if anywhere
        victim.status = RequestStatus.WAITING
        victim.num_preemptions += 1
        self.queues[victim.priority].appendleft(victim)
        if preemptor is not None and self._can_admit(preemptor):
            # The slot it freed is its own: neither the aged head's nor the victim's,
            # which, aged too, ranks first and took it straight back (a preemption a
            # step, the HIGH request still waiting: measured).
            self._admit(preemptor, kv_ops)
        return [victim]

    def _preemptor(self, head: Request) -> Request | None:
        """The waiting request that may preempt (`enable_preemption`): `head` when its
        class is `high_priority_threshold` or better; else, when `head` only ranks first by
        aging, the first waiting request of such a class behind it. Aging orders who gets
        the slots that free up, so a low request is never starved; it does not make a
        high-priority request wait for one."""
        policy = self.policy
        if not policy.enable_preemption:
            return None
        if head.priority <= policy.high_priority_threshold:
            return head
        for priority in PriorityClass:
            if priority <= policy.high_priority_threshold and self.queues[priority]:
                return self.queues[priority][0]
        return None

    def _victim(self, head: Request, min_tokens: int, *, fresh: bool = False) -> Request | None:
        """The newest decoding request of a worse class than `head` that ran `min_tokens`
        since its admission. With `fresh` (preemption), a request never preempted before
        qualifies however little it ran (the guard is there so that a resumed request is
        not preempted again at once), and one still prefilling its prompt does when no
        decoding one does: when a wave of new requests has just taken every slot, a
        high-priority request does not wait for them to produce their first tokens."""
        worse = [
            r
            for r in self.running
            if r.priority > head.priority
            and (r.tokens_since_admit >= min_tokens or (fresh and r.num_preemptions == 0))
        ]
        decoding = [r for r in worse if r.num_computed_tokens >= r.num_prompt_tokens]
        candidates = decoding or (worse if fresh else [])
        if not candidates:
            return None
        return max(candidates, key=lambda r: (r.priority, r.arrival_at))

    @staticmethod
    def _chunk(request: Request, limit: int) -> ScheduledChunk:
        """The next at most `limit` tokens of `request` without KV. A decoding request
        whose only such token is its latest sampled one (almost every row of almost every
        step) gets it without the general path: at 256 sequences that path was a fifth of
        the scheduler's time (bench/scheduler_cost.py)."""
        seq_id = request.seq_id
        if seq_id is None:
            raise RuntimeError(f"{request.request_id} is scheduled without a sequence slot")
        start, out = request.num_computed_tokens, request.output_token_ids
        if out and limit > 0 and start == len(request.prompt_token_ids) + len(out) - 1:
            return ScheduledChunk(request, seq_id, [out[-1]], start, True)
        token_ids = request.tokens_to_compute(limit)
        return ScheduledChunk(
            request=request,
            seq_id=seq_id,
            token_ids=token_ids,
            start_pos=start,
            sample=start + len(token_ids) == request.num_tokens,
        )
