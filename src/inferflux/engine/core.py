"""EngineCore: one step = scheduler.schedule() → backend.decode() → update from the output.

Owns: per-request sampling state (sampler chain, detokenizer, stop matcher), turning
sampled tokens into `RequestDelta`s, finishing requests and freeing their KV. Does not
own: transport (engine/worker.py moves messages), what goes into a step (scheduler/), or
llama.cpp calls (backends/). Thread rule: one thread calls every method.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import msgspec

from inferflux.engine.backends.base import (
    DecodeChunk,
    ModelBackend,
    SamplerHandle,
    SamplerSpec,
    StepInterrupted,
)
from inferflux.engine.core_stats import (
    fairness_stats,
    image_stats,
    prefix_stats,
    spec_stats,
    tier_stats,
)
from inferflux.engine.detokenizer import IncrementalDetokenizer, StopMatcher
from inferflux.engine.host_memory import MemoryWatch
from inferflux.engine.image_prep import ImagePreparer, ImagePromptError, PreparedPrompt
from inferflux.engine.kv_apply import KvApplier
from inferflux.engine.kv_channel import Handoffs, KvChannelEnd
from inferflux.engine.kv_offload import KvOffload
from inferflux.engine.messages import (
    AddRequest,
    EngineStats,
    FinishReason,
    Priority,
    RequestDelta,
    SamplingParams,
    StepStats,
    TokenLogprob,
)
from inferflux.engine.spec_verify import merge_deltas, verify_draft
from inferflux.engine.speculative import NgramProposer
from inferflux.engine.step_recorder import StepRecorder
from inferflux.engine.step_stop import arm, arrival_at
from inferflux.errors import (
    ConstraintFailed,
    ContextLengthExceeded,
    EngineError,
    InvalidRequest,
    KvCacheFull,
)
from inferflux.scheduler import Request, RequestId, ScheduledChunk, Scheduler
from inferflux.scheduler.request import (
    KvOp,
    PriorityClass,
)

_PRIORITY_CLASS = {
    Priority.HIGH: PriorityClass.HIGH,
    Priority.NORMAL: PriorityClass.NORMAL,
    Priority.LOW: PriorityClass.LOW,
}
# Finishes whose KV is worth keeping for a next turn (errors leave the KV undefined).
_CACHEABLE = frozenset(
    {
        FinishReason.STOP,
        FinishReason.STOP_SEQUENCE,
        FinishReason.LENGTH,
        FinishReason.ABORT,
        FinishReason.HANDOFF,
    }
)

# how long a step with nothing but held-back requests waits for them to become ready
_DEFERRED_WAIT_S = 0.05
_TOO_LONG = "prompt plus max_tokens exceeds the KV cache of this worker"
_NO_IMAGES = "this model does not take images: it has no mmproj"

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _SequenceState:
    sampling: SamplingParams
    sampler: SamplerHandle
    detokenizer: IncrementalDetokenizer
    stop: StopMatcher
    prompt_logprobs: list[TokenLogprob | None] | None = None  # filled while prefilling


# SamplerSpec fields copied from SamplingParams as they are (the others are converted)
_COPIED = tuple(
    f.name
    for f in fields(SamplerSpec)
    if f.name not in ("seed", "logit_bias", "dry_sequence_breakers", "samplers")
)


def sampler_spec(params: SamplingParams) -> SamplerSpec:
    """The backend's sampler description; a missing seed becomes a fresh random one."""
    copied: dict[str, Any] = {name: getattr(params, name) for name in _COPIED}  # Any: mixed
    return SamplerSpec(
        seed=params.seed if params.seed is not None else secrets.randbits(32),
        logit_bias=tuple(sorted(params.logit_bias.items())),
        dry_sequence_breakers=tuple(params.dry_sequence_breakers),
        samplers=tuple(params.samplers) if params.samplers is not None else None,
        **copied,
    )


class EngineCore:
    """Continuous batching over one backend. Every method mutates; call from one thread."""

    def __init__(
        self,
        backend: ModelBackend,
        scheduler: Scheduler,
        speculator: NgramProposer | None = None,
        *,
        kv_offload: KvOffload | None = None,
        images: ImagePreparer | None = None,
        channel: KvChannelEnd | None = None,
        role: str = "unified",
    ) -> None:
        """`speculator`: speculative decoding (None = off); it becomes the scheduler's
        draft proposer. `kv_offload`: the prefix cache's host/disk tiers (kv_offload.py).
        `images`: a model with an mmproj (image_prep.py); None = text only. `channel`:
        disaggregated mode's KV hand-off (kv_channel.py), None in unified mode; `role`
        "prefill" | "decode" | "unified"."""
        self.backend = backend
        self.images = images
        self.scheduler = scheduler
        self.kv_offload = kv_offload
        self.speculator = speculator
        scheduler.draft_proposer = speculator
        self._states: dict[RequestId, _SequenceState] = {}
        # constrained requests held back until the backend can build their samplers
        self._deferred: list[AddRequest] = []
        # KV ops of requests that finish while a step's rows are being sampled: applied
        # after the last row, since a KV save may decode (`LlamaCppBackend._settle`), and a
        # decode overwrites the logits the rows not yet sampled are read from
        self._held_kv_ops: list[KvOp] | None = None
        self._stats = EngineStats(kv_cells_total=backend.n_ctx_total)
        self._recorder = StepRecorder()
        self._taken_tokens = (0, 0)  # prompt, generated totals at the last take_step_stats
        self.memory = MemoryWatch()
        self.role = role
        self.handoffs = Handoffs(channel) if channel is not None else None
        self.kv = KvApplier(backend, scheduler, kv_offload, self.handoffs)
        # set by the worker loop: a HIGH request arrived in the step (engine/step_stop.py)
        self.high_arrived: Callable[[], bool] | None = None

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._deferred) or self._preparing()

    def _preparing(self) -> bool:
        return self._num_preparing() > 0

    def _num_preparing(self) -> int:
        return len(self.images) if self.images is not None else 0

    def request_ids(self) -> list[str]:
        """Ids of every request not finished yet (waiting or running)."""
        preparing = self.images.request_ids() if self.images is not None else []
        return list(self._states) + [m.request_id for m in self._deferred] + preparing

    def add_request(
        self, message: AddRequest, prepared: PreparedPrompt | None = None
    ) -> list[RequestDelta]:
        """Queue a request. Returns an error delta (and queues nothing) if it can never run.
        A constrained request waits aside while the backend prepares constraints (the
        first one of a worker's life: `ModelBackend.constraints_ready`); one with images
        while its images are encoded (`prepared`: then done)."""
        if message.images and prepared is None:
            return self._prepare_images(message)
        if message.sampling.constraint is not None and not self.backend.constraints_ready():
            self._deferred.append(message)
            return []
        handoff = self._handoff_of(message, prepared)
        prompt = prepared.token_ids if prepared else message.prompt_token_ids
        request = Request(
            request_id=RequestId(message.request_id),
            # a prefill worker computes all but the last token (`_hand_off`)
            prompt_token_ids=prompt[:-1] if handoff else prompt,
            max_tokens=prepared.max_tokens if prepared else message.sampling.max_tokens,
            priority=_PRIORITY_CLASS[message.priority],
            cache_namespace=message.cache_namespace,
            use_prefix_cache=message.sampling.prompt_logprobs is None,  # logprobs: all positions
            streamed=message.hold_s == 0,
            image_spans=prepared.image_spans if prepared else (),
            arrival_at=arrival_at(message.sent_at),
        )
        problem = self._reject_reason(request)
        if problem is not None:
            self._unpin(message.request_id)
            # with images, only the worker knows the prompt's length: the client's error
            code = ContextLengthExceeded.code if prepared and problem == _TOO_LONG else None
            return [_error_delta(message.request_id, problem, request.num_prompt_tokens, code)]
        try:
            sampler = self.backend.make_sampler(sampler_spec(message.sampling))
        except ValueError as exc:
            self._unpin(message.request_id)
            return [_error_delta(message.request_id, str(exc), 0)]
        except Exception:  # NOTE: one request's failure must not take the worker down
            logger.exception("could not build the sampler of %s", message.request_id)
            self._unpin(message.request_id)
            return [_error_delta(message.request_id, "invalid sampling parameters", 0)]
        self._take_ticket(message, request, handoff)
        self.scheduler.add(request)
        if self.speculator is not None:  # n-grams over pseudo tokens would draft them
            enabled = message.sampling.speculative and not message.images
            self.speculator.register(request, enabled=enabled)
        self._states[request.request_id] = _SequenceState(
            sampling=message.sampling,
            sampler=sampler,
            detokenizer=IncrementalDetokenizer(),
            stop=StopMatcher(message.sampling.stop),
            prompt_logprobs=[None] if message.sampling.prompt_logprobs is not None else None,
        )
        return []

    def _handoff_of(self, message: AddRequest, prepared: PreparedPrompt | None) -> bool:
        """True when this prefill worker hands `message` off (writes a ticket) instead of
        decoding it: the API asks so only for text prompts of two tokens or more."""
        return bool(message.ticket_path) and self.handoffs is not None and prepared is None

    def _take_ticket(self, message: AddRequest, request: Request, handoff: bool) -> None:
        """Remember where a prefill request's ticket goes, or which ticket a decode request
        hydrates. A ticket that cannot apply (this worker has no channel, or it covers
        anything but the prompt's first n-1 tokens) is dropped: the prompt is computed."""
        handoffs, ticket = self.handoffs, message.kv_ticket
        if handoff and handoffs is not None:
            handoffs.expect_out(request.request_id, message.ticket_path)
        elif ticket is not None:
            if handoffs is None or ticket.n_tokens != request.num_prompt_tokens - 1:
                logger.warning("the KV ticket of %s does not apply here", request.request_id)
                return
            request.ticket_tokens = ticket.n_tokens
            handoffs.expect_in(request.request_id, ticket)

    def _reject_reason(self, request: Request) -> str | None:
        if request.request_id in self._states:
            return f"duplicate request id {request.request_id}"
        if not request.prompt_token_ids:
            return "the prompt is empty"
        if request.max_tokens < 1:
            return "max_tokens must be at least 1"
        if not self.scheduler.can_ever_fit(request):
            return _TOO_LONG
        return None

    def _prepare_images(self, message: AddRequest) -> list[RequestDelta]:
        if self.images is None:
            return [_error_delta(message.request_id, _NO_IMAGES, 0, InvalidRequest.code)]
        if message.sampling.prompt_logprobs is not None:
            problem = "prompt_logprobs cannot be used with images"
            return [_error_delta(message.request_id, problem, 0, InvalidRequest.code)]
        self.images.submit(message)
        return []

    def _admit_prepared(self) -> list[RequestDelta]:
        """Requests whose images are encoded join the queue (or fail: a 400)."""
        if self.images is None or not len(self.images):
            return []
        busy = self.scheduler.has_work() or bool(self._deferred)
        deltas: list[RequestDelta] = []
        for message, prepared in self.images.done(0.0 if busy else _DEFERRED_WAIT_S):
            if isinstance(prepared, ImagePromptError):
                problem, code = str(prepared), prepared.code
                deltas.append(_error_delta(message.request_id, problem, 0, code))
            else:
                deltas.extend(self.add_request(message, prepared))
        return deltas

    def _unpin(self, request_id: str) -> None:
        if self.images is not None:
            self.images.rows.unpin(request_id)

    def _admit_deferred(self) -> list[RequestDelta]:
        if not self._deferred:
            return []
        wait_s = 0.0 if self.scheduler.has_work() else _DEFERRED_WAIT_S  # idle: nothing stalls
        if not self.backend.constraints_ready(wait_s):
            return []
        held, self._deferred = self._deferred, []
        return [delta for message in held for delta in self.add_request(message)]

    def abort_requests(self, request_ids: list[str]) -> list[RequestDelta]:
        """Finish these requests now (ABORT) and free their KV. Unknown ids are ignored."""
        aborted = set(request_ids)
        deltas = [_aborted_delta(m) for m in self._deferred if m.request_id in aborted]
        if self.images is not None:
            deltas.extend(_aborted_delta(m) for m in self.images.drop(aborted))
        self._deferred = [m for m in self._deferred if m.request_id not in aborted]
        for request_id in request_ids:
            request = self.scheduler.get(RequestId(request_id))
            if request is not None:
                deltas.append(self._finish(request, FinishReason.ABORT, ""))
        return deltas

    def step(self) -> list[RequestDelta]:
        """Run one step: one llama_decode over every scheduled chunk; one delta per
        request that produced text, a token, or finished."""
        started_at = time.monotonic()
        self._watch_memory(started_at)
        deltas = self._admit_deferred()
        deltas.extend(self._admit_prepared())
        output = self.scheduler.schedule()
        deltas.extend(self._timed_out(r) for r in output.timed_out)
        recompute = self.kv.apply(output.kv_ops)
        chunks = [c for c in output.chunks if c.request.request_id not in recompute]
        if not chunks:
            return deltas
        # NOTE: the cost model learns from here: KV ops cost their tokens, not the step's shape
        ops_done_at = time.monotonic()
        self._recorder.on_scheduled(chunks, started_at)
        armed = arm(self.backend, chunks, output.num_tokens, self.scheduler, self.high_arrived)
        try:
            deltas.extend(self._run_chunks(chunks, evicted=False))
        except StepInterrupted:
            self.scheduler.counters.interrupts += 1
            return deltas  # nothing of the step is kept: the next one plans again
        finally:
            if armed:
                self.backend.set_interrupt(None)
        self._stats.num_steps += 1
        self._recorder.on_step_done(chunks, output.num_tokens, started_at)
        # draft rows are decode-shaped rows (one logits row per token)
        decoding = sum(
            1 + len(c.draft_token_ids) for c in chunks if c.sample and len(c.token_ids) == 1
        )
        self.scheduler.observe_step(
            decoding, output.num_tokens - decoding, time.monotonic() - ops_done_at
        )
        return deltas

    def _run_chunks(self, chunks: list[ScheduledChunk], *, evicted: bool) -> list[RequestDelta]:
        """Decode `chunks` in one llama_decode and take their outputs. A failed decode
        fails no request by itself (REQ-9.2, 9.3): the sequences are trimmed back to where
        the step began; with no KV room, the prefix cache is evicted and the step retried
        once; then the batch is split in halves, each decoded (and its outputs taken, as
        the next decode overwrites the logits) on its own, down to single requests, and
        only a request that fails alone finishes with an error."""
        plan: list[DecodeChunk] = [
            (c.seq_id, c.token_ids + list(c.draft_token_ids), c.start_pos, self._n_logits(c))
            for c in chunks
        ]
        decode_started = time.monotonic()
        try:
            rows = self.backend.decode(plan)
        except StepInterrupted:
            for chunk in chunks:
                self._undo(chunk)
            raise
        except EngineError as exc:
            self._stats.decode_failures += 1
            chunks = [c for c in chunks if self._undo(c)]
            if not chunks:
                return []
            if isinstance(exc, KvCacheFull) and not evicted and self.kv.evict_prefix_cache():
                logger.warning("%s: evicted the prefix cache, retrying the step", exc)
                return self._run_chunks(chunks, evicted=True)
            if len(chunks) == 1:
                logger.error("request %s failed: %s", chunks[0].request.request_id, exc)
                return [self._failed(chunks[0].request, exc)]
            logger.warning("%s: splitting a step of %d requests", exc, len(chunks))
            half = len(chunks) // 2
            first = self._run_chunks(chunks[:half], evicted=True)
            return first + self._run_chunks(chunks[half:], evicted=True)
        if self.kv_offload is not None:
            tokens = sum(len(c.token_ids) for c in chunks)
            self.kv_offload.observe_step(tokens, time.monotonic() - decode_started)
        return self._update_from_output(chunks, rows)

    def _undo(self, chunk: ScheduledChunk) -> bool:
        """Trim the chunk's sequence back to where the step began. False when llama.cpp
        refuses the partial removal (the sequence is then empty): the request computes
        again from its first token next step instead of in this retry."""
        if self.backend.trim_seq(chunk.seq_id, chunk.start_pos):
            return True
        chunk.request.num_computed_tokens = 0
        return False

    def _watch_memory(self, now: float) -> None:
        """Memory pressure (REQ-9.5): the scheduler halves admissions and its step budget
        while host memory is below `memory_low_bytes`, and the prefix cache is evicted
        when an episode begins."""
        was = self.memory.pressure
        pressure = self.memory.poll(now, self.scheduler.policy.memory_low_bytes)
        self.scheduler.memory_pressure = pressure
        if pressure and not was:
            logger.warning(
                "memory pressure: %s bytes available; halving admissions and the step budget, "
                "evicting the prefix cache (its host tier moves to disk)",
                self.memory.available,
            )
            self.kv.evict_prefix_cache(spill=False)  # host RAM is what is short
            if self.kv_offload is not None:
                self.kv_offload.store.shed_host()
        elif was and not pressure:
            logger.info("memory pressure over: %s bytes available", self.memory.available)

    def _failed(self, request: Request, exc: EngineError) -> RequestDelta:
        code = exc.code if isinstance(exc, KvCacheFull) else None
        return self._finish(request, FinishReason.ERROR, "", exc.message, error_code=code)

    def take_step_stats(self) -> StepStats | None:
        """Timings and token counts since the previous call (None if nothing ran or
        finished); the worker sends them with its next message."""
        prompt, generated = (
            self._stats.num_prompt_tokens_total,
            self._stats.num_generated_tokens_total,
        )
        last_prompt, last_generated = self._taken_tokens
        self._taken_tokens = (prompt, generated)
        step = self._recorder.take(prompt - last_prompt, generated - last_generated)
        if step is not None and self.handoffs is not None:
            step.transfer_s = self.handoffs.end.recorder.take_transfer_s()
        return step

    def wait_s(self) -> float:
        """How long the worker may sleep before `step()` has work (0 = run now)."""
        if self._deferred or self._preparing():
            return 0.0  # step() waits for them (briefly, so inputs are still read)
        return self.scheduler.idle_wait_s()

    def _n_logits(self, chunk: ScheduledChunk) -> int:
        if self.handoffs is not None and self.handoffs.sends(chunk.request.request_id):
            return 0  # a hand-off samples nothing: its decode worker computes the last token
        if _scores_prompt(chunk, self._states[chunk.request.request_id]):
            return len(chunk.token_ids)
        return 1 + len(chunk.draft_token_ids) if chunk.sample else 0

    def _timed_out(self, request: Request) -> RequestDelta:
        self._recorder.on_finished(request, FinishReason.TIMEOUT)
        if self.speculator is not None:
            self.speculator.forget(request.request_id)
        state = self._states.pop(request.request_id)
        state.sampler.close()
        if self.handoffs is not None:
            self.handoffs.drop(request.request_id)
        delta = _delta(request, "", [])
        delta.finish_reason = FinishReason.TIMEOUT
        delta.error = "the request waited in the queue longer than scheduler.queue_timeout_s"
        return delta

    def _update_from_output(
        self, chunks: list[ScheduledChunk], rows: list[int]
    ) -> list[RequestDelta]:
        deltas: list[RequestDelta] = []
        self._held_kv_ops = []
        try:
            for chunk, row in zip(chunks, rows, strict=True):
                request = chunk.request
                state = self._states[request.request_id]
                if _scores_prompt(chunk, state):
                    self._score_prompt(chunk, row, state)
                request.num_computed_tokens += len(chunk.token_ids)
                if request.num_computed_tokens <= request.num_prompt_tokens:
                    self._stats.num_prompt_tokens_total += len(chunk.token_ids)
                if chunk.draft_token_ids:
                    deltas.append(self._verify(chunk, row))
                elif chunk.sample and self.handoffs and self.handoffs.sends(request.request_id):
                    deltas.append(self._hand_off(request, chunk.seq_id))
                elif chunk.sample:
                    deltas.append(self._sample_isolated(chunk, row))
        finally:
            held, self._held_kv_ops = self._held_kv_ops, None
            if held:  # the step loop runs this every step: no spill check when none finished
                self.kv.apply(held)
        return deltas

    def _hand_off(self, request: Request, seq_id: int) -> RequestDelta:
        """Prefill side: the prompt but its last token is computed: write the KV ticket
        and finish (HANDOFF, its prefix cached here). A ticket that cannot be written
        finishes HANDOFF without one: the API then runs the prompt on a decode worker."""
        assert self.handoffs is not None  # only with one (`_handoff_of`)
        ticket = self.handoffs.write(
            request.request_id, seq_id, request.prompt_token_ids, request.cache_namespace
        )
        delta = self._finish(request, FinishReason.HANDOFF, "")
        if ticket is not None:
            ticket.num_cached_tokens = request.num_cached_tokens
        delta.ticket = ticket
        return delta

    def _verify(self, chunk: ScheduledChunk, row: int) -> RequestDelta:
        """Emit the tokens a draft yields (engine/spec_verify.py), record its outcome and
        drop the KV of rejected draft tokens (a refused trim recomputes the sequence)."""
        request = chunk.request
        deltas, accepted = verify_draft(chunk, row, lambda r: self._sample_isolated(chunk, r))
        assert self.speculator is not None  # drafts come from it
        self.speculator.record(request, len(chunk.draft_token_ids), accepted)
        merged = merge_deltas(deltas)
        merged.num_draft_tokens = request.num_draft_tokens
        merged.num_draft_accepted = request.num_draft_accepted
        rejected = merged.finish_reason is None and accepted < len(chunk.draft_token_ids)
        if rejected and not self.backend.trim_seq(chunk.seq_id, request.num_computed_tokens):
            self.scheduler.cache_copy_failed(request)  # recompute from the start
        return merged

    def _score_prompt(self, chunk: ScheduledChunk, row: int, state: _SequenceState) -> None:
        """Logprobs of the prompt tokens this chunk's logits predict (the next ones)."""
        assert state.prompt_logprobs is not None and state.sampling.prompt_logprobs is not None
        prompt = chunk.request.prompt_token_ids
        start, end = chunk.start_pos, chunk.start_pos + len(chunk.token_ids)
        targets = prompt[start + 1 : min(end + 1, len(prompt))]
        if not targets:
            return
        last_row = row - (end - start - len(targets))  # row of the last scored position
        scored = self.backend.logprobs(last_row, targets, state.sampling.prompt_logprobs)
        state.prompt_logprobs.extend(
            TokenLogprob(t, lp, top) for t, (lp, top) in zip(targets, scored, strict=True)
        )

    def _sample_isolated(self, chunk: ScheduledChunk, row: int) -> RequestDelta:
        """`_sample_one`, but a failure finishes only this request (ERROR): a known one
        (its constraint failed) with its message and code, an unexpected one logged."""
        try:
            return self._sample_one(chunk, row)
        except ConstraintFailed as exc:
            logger.info("request %s: %s", chunk.request.request_id, exc.message)
            return self._finish(
                chunk.request, FinishReason.ERROR, "", exc.message, error_code=exc.code
            )
        except Exception:  # NOTE: the batch goes on without the failed request
            logger.exception("sampling failed for %s", chunk.request.request_id)
            return self._finish(chunk.request, FinishReason.ERROR, "", "sampling failed")

    def _sample_one(self, chunk: ScheduledChunk, row: int) -> RequestDelta:
        request = chunk.request
        state = self._states[request.request_id]
        token = self.backend.sample(state.sampler, row)
        request.output_token_ids.append(token)
        self._stats.num_generated_tokens_total += 1
        self.scheduler.counters.tokens[request.priority] += 1
        finish: FinishReason | None = None
        text = ""
        matched: str | None = None
        if token in self.backend.eog_token_ids and not state.sampling.ignore_eos:
            finish = FinishReason.STOP
        else:
            text, matched = state.stop.push(state.detokenizer.push(self.backend.piece(token)))
            if matched is not None:
                finish = FinishReason.STOP_SEQUENCE
            elif state.sampler.constraint_complete:
                finish = FinishReason.STOP
            elif len(request.output_token_ids) >= request.max_tokens:
                finish = FinishReason.LENGTH
        delta = (
            self._finish(request, finish, text, token_ids=[token], stop_sequence=matched)
            if finish is not None
            else _delta(request, text, [token])
        )
        if state.sampling.logprobs is not None:
            ((logprob, top),) = self.backend.logprobs(row, [token], state.sampling.logprobs)
            delta.logprobs = [TokenLogprob(token, logprob, top)]
        if state.prompt_logprobs is not None and len(request.output_token_ids) == 1:
            delta.prompt_logprobs = state.prompt_logprobs
        return delta

    def _finish(
        self,
        request: Request,
        reason: FinishReason,
        text: str,
        error: str | None = None,
        *,
        token_ids: list[int] | None = None,
        error_code: str | None = None,
        stop_sequence: str | None = None,
    ) -> RequestDelta:
        """Remove the request, free its KV and sampler; the last delta carries held text
        unless a stop string matched (that text is never released)."""
        self._recorder.on_finished(request, reason)
        if self.speculator is not None:
            self.speculator.forget(request.request_id)
        _, ops = self.scheduler.finish(request.request_id, cache=reason in _CACHEABLE)
        if self._held_kv_ops is not None:
            self._held_kv_ops.extend(ops)  # after the step's last row is sampled
        else:
            self.kv.apply(ops)
        state = self._states.pop(request.request_id)
        self._unpin(request.request_id)
        if self.handoffs is not None:
            self.handoffs.drop(request.request_id)
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            text += state.stop.push(state.detokenizer.flush())[0] + state.stop.flush()
        state.sampler.close()
        delta = _delta(request, text, token_ids or [])
        delta.finish_reason = reason
        delta.error = error
        delta.error_code = error_code
        delta.stop_sequence = stop_sequence
        return delta

    def stats(self) -> EngineStats:
        """Counters and gauges now (a fresh copy; safe to send)."""
        s = self._stats
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting + len(self._deferred) + self._num_preparing(),
            num_steps=s.num_steps,
            num_prompt_tokens_total=s.num_prompt_tokens_total,
            num_generated_tokens_total=s.num_generated_tokens_total,
            kv_cells_used=sum(r.num_computed_tokens for r in self.scheduler.running),
            kv_cells_total=s.kv_cells_total,
            decode_failures=s.decode_failures,
            memory_pressure=self.memory.pressure,
            memory_pressure_episodes=self.memory.episodes,
            host_memory_available_bytes=(
                self.memory.available if self.memory.available is not None else -1
            ),
            waiting_by_priority={
                p.name.lower(): n for p, n in self.scheduler.num_waiting_by_class().items()
            },
            fairness=fairness_stats(self.scheduler),
            prefix_cache=prefix_stats(self.scheduler),
            kv_tiers=tier_stats(self.kv_offload),
            speculative=spec_stats(self.speculator),
            images=image_stats(self.images),
            role=self.role,
            tickets=(
                msgspec.structs.replace(self.handoffs.end.recorder.stats)
                if self.handoffs is not None
                else None
            ),
        )

    def close(self) -> None:
        """Abort everything and free the backend."""
        self.abort_requests(self.request_ids())
        if self.kv_offload is not None:
            parked = self.scheduler.parked.entries() if self.scheduler.parked else []
            self.kv_offload.close(self.scheduler.prefix_cache, parked)  # the final snapshot
        if self.speculator is not None:
            self.speculator.close()
        if self.images is not None:
            self.images.close()  # before the model its encoder points into
        self.backend.close()


def _scores_prompt(chunk: ScheduledChunk, state: _SequenceState) -> bool:
    """True when this chunk's prompt positions still need their logprobs (not when a
    preempted request recomputes them)."""
    scored = state.prompt_logprobs
    return scored is not None and len(scored) == chunk.start_pos + 1 < (
        chunk.request.num_prompt_tokens
    )


def _delta(request: Request, text: str, token_ids: list[int]) -> RequestDelta:
    return RequestDelta(
        request_id=request.request_id,
        text=text,
        token_ids=token_ids,
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=len(request.output_token_ids),
        num_cached_tokens=request.num_cached_tokens,
        num_draft_tokens=request.num_draft_tokens,
        num_draft_accepted=request.num_draft_accepted,
    )


def _aborted_delta(message: AddRequest) -> RequestDelta:
    return RequestDelta(
        request_id=message.request_id,
        finish_reason=FinishReason.ABORT,
        num_prompt_tokens=len(message.prompt_token_ids),
    )


def _error_delta(
    request_id: str, message: str, num_prompt_tokens: int, code: str | None = None
) -> RequestDelta:
    return RequestDelta(
        request_id=request_id,
        finish_reason=FinishReason.ERROR,
        error=message,
        error_code=code,
        num_prompt_tokens=num_prompt_tokens,
    )
