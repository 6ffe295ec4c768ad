"""A hypothesis state machine over the scheduler: submit / cancel / step / time passing in
random orders, with preemption, yields, the prefix cache and queue timeouts all active.

Invariants: no request is lost or duplicated; each ends in exactly one terminal state;
first admissions are FIFO within a priority class; slots are never shared; every KV op
names a valid sequence; a timed-out request never runs afterwards. A model of every
sequence's KV (which token sits at which position, moved by the KV ops) checks that each
chunk extends exactly the tokens its request has computed, and that each prefix-cache
entry and parked prefix holds the tokens the index says. The machine runs three times:
with every step carrying each stream's token; with prompt bursts (`burst_stall_s`),
where the streams stand aside and prompts go shortest first; and with finished requests'
KV parked in their slots and continued in place (`park`, scheduler/parking.py).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inferflux.scheduler import Request, RequestId, RequestStatus, Scheduler
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import KvCopy, KvFree, KvKeep, KvMove, KvOp, PriorityClass

MAX_SEQS = 3
CACHE_SLOTS = [3, 4]


class SchedulerMachine(RuleBasedStateMachine):
    burst_stall_s = 0.0
    park = False

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.sched = Scheduler(
            max_num_seqs=MAX_SEQS,
            max_batch_tokens=8,
            kv_capacity=None,
            policy=SchedulingPolicy(
                queue_timeout_s=3.0,
                aging_s=1.0,
                max_timeslice_tokens=3,
                enable_preemption=True,
                burst_stall_s=self.burst_stall_s,
            ),
            prefix_cache=PrefixCache(CACHE_SLOTS, max_tokens=30, min_match=2),
            clock=lambda: self.now,
            park=self.park,
        )
        self.kv: dict[int, list[int]] = {}  # sequence -> the token at each position
        self.submitted: dict[str, Request] = {}
        self.terminal: dict[str, str] = {}
        self.first_admitted: list[str] = []
        self.counter = 0

    # -- rules ---------------------------------------------------------------------
    @rule(
        priority=st.sampled_from(list(PriorityClass)),
        prompt=st.lists(st.integers(0, 2), min_size=1, max_size=6),
        max_tokens=st.integers(1, 8),
    )
    def submit(self, priority: PriorityClass, prompt: list[int], max_tokens: int) -> None:
        self.counter += 1
        rid = f"r{self.counter}"
        request = Request(
            request_id=RequestId(rid),
            prompt_token_ids=prompt,
            max_tokens=max_tokens,
            priority=priority,
            arrival_at=self.now,
        )
        self.sched.add(request)
        self.submitted[rid] = request

    @precondition(lambda self: any(r not in self.terminal for r in self.submitted))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        live = sorted(r for r in self.submitted if r not in self.terminal)
        rid = data.draw(st.sampled_from(live))
        request, ops = self.sched.finish(RequestId(rid), cache=True)
        assert request is not None
        self._check_ops(ops)
        self._end(rid, "cancelled")

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.5]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def step(self) -> None:
        out = self.sched.schedule()
        self._check_ops(out.kv_ops)
        for request in out.timed_out:
            assert not request.output_token_ids
            self._end(request.request_id, "timeout")
        seqs = [c.seq_id for c in out.chunks]
        assert len(seqs) == len(set(seqs))
        for request in self.sched.running:  # in admission order
            if request.request_id not in self.first_admitted:
                self.first_admitted.append(request.request_id)
        for chunk in out.chunks:
            request = chunk.request
            assert request.request_id not in self.terminal
            assert request.request_id in self.first_admitted
            assert chunk.start_pos == request.num_computed_tokens
            known = request.prompt_token_ids + request.output_token_ids
            held = self.kv.get(chunk.seq_id, [])
            assert held == known[: chunk.start_pos]  # the KV it continues is its own
            assert (
                chunk.token_ids == known[chunk.start_pos : chunk.start_pos + len(chunk.token_ids)]
            )
            self.kv[chunk.seq_id] = held + chunk.token_ids
            request.num_computed_tokens += len(chunk.token_ids)
            if chunk.sample:
                request.output_token_ids.append(1)
                if len(request.output_token_ids) >= request.max_tokens:
                    _, ops = self.sched.finish(request.request_id, cache=True)
                    self._check_ops(ops)
                    self._end(request.request_id, "finished")
        assert out.num_tokens <= 8

    # -- helpers -------------------------------------------------------------------
    def _end(self, rid: str, how: str) -> None:
        assert rid not in self.terminal, f"{rid} ended twice ({self.terminal[rid]}, {how})"
        self.terminal[rid] = how
        assert self.submitted[rid].status == RequestStatus.FINISHED

    def _check_ops(self, ops: list[KvOp]) -> None:
        """Every op names valid sequences; apply it to the KV model."""
        valid = set(range(MAX_SEQS)) | set(CACHE_SLOTS)
        for op in ops:
            if isinstance(op, KvFree):
                assert op.seq_id in valid
                self.kv[op.seq_id] = []
            elif isinstance(op, KvKeep):
                assert self.park and 0 <= op.seq_id < MAX_SEQS
                assert 0 < op.n_tokens <= len(self.kv.get(op.seq_id, []))
                self.kv[op.seq_id] = self.kv[op.seq_id][: op.n_tokens]
            else:
                assert isinstance(op, KvCopy | KvMove)
                assert not isinstance(op, KvMove) or self.park
                assert op.src in valid and op.dst in valid and op.src != op.dst
                assert 0 < op.n_tokens <= len(self.kv.get(op.src, []))
                self.kv[op.dst] = self.kv[op.src][: op.n_tokens]

    # -- invariants ----------------------------------------------------------------
    @invariant()
    def every_request_is_in_exactly_one_place(self) -> None:
        waiting = [r.request_id for q in self.sched.queues.values() for r in q]
        running = [r.request_id for r in self.sched.running]
        assert len(waiting) == len(set(waiting)) and not set(waiting) & set(running)
        live = set(waiting) | set(running)
        assert live | set(self.terminal) == set(self.submitted)
        assert not live & set(self.terminal)

    @invariant()
    def slots_are_exclusive(self) -> None:
        seqs = [r.seq_id for r in self.sched.running]
        assert None not in seqs and len(seqs) == len(set(seqs))
        assert all(0 <= s < MAX_SEQS for s in seqs if s is not None)
        assert len(seqs) <= MAX_SEQS

    @invariant()
    def first_admissions_are_fifo_within_a_class(self) -> None:
        for priority in PriorityClass:
            order = [r for r in self.first_admitted if self.submitted[r].priority == priority]
            arrivals = [self.submitted[r].arrival_at for r in order]
            assert arrivals == sorted(arrivals)
            numbers = [int(r[1:]) for r in order]
            assert numbers == sorted(numbers)

    @invariant()
    def cache_stays_within_budget(self) -> None:
        cache = self.sched.prefix_cache
        assert cache is not None and cache.cached_tokens <= 30

    @invariant()
    def cached_and_parked_prefixes_hold_their_tokens(self) -> None:
        cache = self.sched.prefix_cache
        assert cache is not None
        for slot, _, tokens in cache.entries():
            assert slot in CACHE_SLOTS and self.kv.get(slot) == tokens
        parked = self.sched.parked
        assert (parked is not None) == self.park
        running = {r.seq_id for r in self.sched.running}
        for entry in parked.entries() if parked is not None else []:
            assert entry.slot not in running and self.kv.get(entry.slot) == entry.tokens


TestScheduler = SchedulerMachine.TestCase
TestScheduler.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


class BurstSchedulerMachine(SchedulerMachine):
    burst_stall_s = 2.0


TestBurstScheduler = BurstSchedulerMachine.TestCase
TestBurstScheduler.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


class ParkedSchedulerMachine(SchedulerMachine):
    park = True


TestParkedScheduler = ParkedSchedulerMachine.TestCase
TestParkedScheduler.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def test_low_priority_wait_is_bounded_under_saturating_high_priority_load() -> None:
    """With aging_s = 1 and one slot, a LOW request is admitted within 2 s plus the
    service time of the HIGH requests that arrived before it had fully aged."""
    now = [0.0]
    sched = Scheduler(
        max_num_seqs=1,
        max_batch_tokens=8,
        kv_capacity=None,
        policy=SchedulingPolicy(aging_s=1.0, enable_preemption=False),
        clock=lambda: now[0],
    )
    sched.add(Request(RequestId("low"), [1], 1, priority=PriorityClass.LOW, arrival_at=0.0))
    admitted_at = None
    for i in range(200):
        now[0] += 0.05  # saturating: a HIGH arrives every 50 ms, each takes 50 ms
        sched.add(
            Request(RequestId(f"h{i}"), [1], 1, priority=PriorityClass.HIGH, arrival_at=now[0])
        )
        out = sched.schedule()
        (chunk,) = out.chunks
        sched.finish(chunk.request.request_id)
        if chunk.request.request_id == "low":
            admitted_at = now[0]
            break
    assert admitted_at is not None and admitted_at <= 2.0 + 0.05 + 1e-9
