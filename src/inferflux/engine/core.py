"""EngineCore: one step = scheduler.schedule() → backend.decode() → update from the output.

Owns: per-request sampling state (sampler chain, detokenizer, stop matcher), turning
sampled tokens into `RequestDelta`s, finishing requests and freeing their KV. Does not
own: transport (engine/worker.py moves messages), what goes into a step (scheduler/), or
llama.cpp calls (backends/). Thread rule: one thread calls every method.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

from inferflux.engine.backends.base import DecodeChunk, ModelBackend, SamplerHandle, SamplerSpec
from inferflux.engine.detokenizer import IncrementalDetokenizer, StopMatcher
from inferflux.engine.messages import (
    AddRequest,
    EngineStats,
    FinishReason,
    RequestDelta,
    SamplingParams,
)
from inferflux.errors import EngineError
from inferflux.scheduler import Request, RequestId, ScheduledChunk, Scheduler, SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _SequenceState:
    sampling: SamplingParams
    sampler: SamplerHandle
    detokenizer: IncrementalDetokenizer
    stop: StopMatcher


def sampler_spec(params: SamplingParams) -> SamplerSpec:
    """The backend's sampler description; a missing seed becomes a fresh random one."""
    return SamplerSpec(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        seed=params.seed if params.seed is not None else secrets.randbits(32),
        repeat_penalty=params.repeat_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        penalty_last_n=params.penalty_last_n,
        logit_bias=tuple(sorted(params.logit_bias.items())),
        ignore_eos=params.ignore_eos,
    )


class EngineCore:
    """Continuous batching over one backend. Every method mutates; call from one thread."""

    def __init__(self, backend: ModelBackend, scheduler: Scheduler) -> None:
        self.backend = backend
        self.scheduler = scheduler
        self._states: dict[RequestId, _SequenceState] = {}
        self._stats = EngineStats(kv_cells_total=backend.n_ctx_total)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def request_ids(self) -> list[str]:
        """Ids of every request not finished yet (waiting or running)."""
        return list(self._states)

    def add_request(self, message: AddRequest) -> list[RequestDelta]:
        """Queue a request. Returns an error delta (and queues nothing) if it can never run."""
        request = Request(
            request_id=RequestId(message.request_id),
            prompt_token_ids=message.prompt_token_ids,
            max_tokens=message.sampling.max_tokens,
        )
        problem = self._reject_reason(request)
        if problem is not None:
            return [_error_delta(message.request_id, problem, request.num_prompt_tokens)]
        try:
            sampler = self.backend.make_sampler(sampler_spec(message.sampling))
        except Exception:  # NOTE: one request's failure must not take the worker down
            logger.exception("could not build the sampler of %s", message.request_id)
            return [_error_delta(message.request_id, "invalid sampling parameters", 0)]
        self.scheduler.add(request)
        self._states[request.request_id] = _SequenceState(
            sampling=message.sampling,
            sampler=sampler,
            detokenizer=IncrementalDetokenizer(),
            stop=StopMatcher(message.sampling.stop),
        )
        return []

    def _reject_reason(self, request: Request) -> str | None:
        if request.request_id in self._states:
            return f"duplicate request id {request.request_id}"
        if not request.prompt_token_ids:
            return "the prompt is empty"
        if request.max_tokens < 1:
            return "max_tokens must be at least 1"
        if not self.scheduler.can_ever_fit(request):
            return "prompt plus max_tokens exceeds the KV cache of this worker"
        return None

    def abort_requests(self, request_ids: list[str]) -> list[RequestDelta]:
        """Finish these requests now (ABORT) and free their KV. Unknown ids are ignored."""
        deltas = []
        for request_id in request_ids:
            request = self.scheduler.get(RequestId(request_id))
            if request is not None:
                deltas.append(self._finish(request, FinishReason.ABORT, ""))
        return deltas

    def step(self) -> list[RequestDelta]:
        """Run one step: one llama_decode over every scheduled chunk; one delta per
        request that produced text, a token, or finished."""
        output = self.scheduler.schedule()
        if output.empty:
            return []
        plan: list[DecodeChunk] = [
            (c.seq_id, c.token_ids, c.start_pos, c.sample) for c in output.chunks
        ]
        try:
            rows = self.backend.decode(plan)
        except EngineError as exc:
            logger.error("step of %d tokens failed: %s", output.num_tokens, exc)
            return [
                self._finish(c.request, FinishReason.ERROR, "", str(exc)) for c in output.chunks
            ]
        self._stats.num_steps += 1
        return self._update_from_output(output, rows)

    def _update_from_output(self, output: SchedulerOutput, rows: list[int]) -> list[RequestDelta]:
        deltas: list[RequestDelta] = []
        for chunk, row in zip(output.chunks, rows, strict=True):
            request = chunk.request
            request.num_computed_tokens += len(chunk.token_ids)
            if request.num_computed_tokens <= request.num_prompt_tokens:
                self._stats.num_prompt_tokens_total += len(chunk.token_ids)
            if chunk.sample:
                deltas.append(self._sample_isolated(chunk, row))
        return deltas

    def _sample_isolated(self, chunk: ScheduledChunk, row: int) -> RequestDelta:
        """`_sample_one`, but an unexpected failure finishes only this request (ERROR)."""
        try:
            return self._sample_one(chunk, row)
        except Exception:  # NOTE: the batch goes on without the failed request
            logger.exception("sampling failed for %s", chunk.request.request_id)
            return self._finish(chunk.request, FinishReason.ERROR, "", "sampling failed")

    def _sample_one(self, chunk: ScheduledChunk, row: int) -> RequestDelta:
        request = chunk.request
        state = self._states[request.request_id]
        token = self.backend.sample(state.sampler, row)
        request.output_token_ids.append(token)
        self._stats.num_generated_tokens_total += 1
        if token in self.backend.eog_token_ids and not state.sampling.ignore_eos:
            return self._finish(request, FinishReason.STOP, "", token_ids=[token])
        text, matched = state.stop.push(state.detokenizer.push(self.backend.piece(token)))
        if matched is not None:
            return self._finish(request, FinishReason.STOP_SEQUENCE, text, token_ids=[token])
        if len(request.output_token_ids) >= request.max_tokens:
            return self._finish(request, FinishReason.LENGTH, text, token_ids=[token])
        return _delta(request, text, [token])

    def _finish(
        self,
        request: Request,
        reason: FinishReason,
        text: str,
        error: str | None = None,
        *,
        token_ids: list[int] | None = None,
    ) -> RequestDelta:
        """Remove the request, free its KV and sampler; the last delta carries held text
        unless a stop string matched (that text is never released)."""
        self.scheduler.finish(request.request_id)
        state = self._states.pop(request.request_id)
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            text += state.stop.push(state.detokenizer.flush())[0] + state.stop.flush()
        state.sampler.close()
        if request.seq_id is not None:
            self.backend.free_seq(request.seq_id)
        delta = _delta(request, text, token_ids or [])
        delta.finish_reason = reason
        delta.error = error
        return delta

    def stats(self) -> EngineStats:
        """Counters and gauges now (a fresh copy; safe to send)."""
        s = self._stats
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_steps=s.num_steps,
            num_prompt_tokens_total=s.num_prompt_tokens_total,
            num_generated_tokens_total=s.num_generated_tokens_total,
            kv_cells_used=sum(r.num_computed_tokens for r in self.scheduler.running),
            kv_cells_total=s.kv_cells_total,
        )

    def close(self) -> None:
        """Abort everything and free the backend."""
        self.abort_requests(self.request_ids())
        self.backend.close()


def _delta(request: Request, text: str, token_ids: list[int]) -> RequestDelta:
    return RequestDelta(
        request_id=request.request_id,
        text=text,
        token_ids=token_ids,
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=len(request.output_token_ids),
    )


def _error_delta(request_id: str, message: str, num_prompt_tokens: int) -> RequestDelta:
    return RequestDelta(
        request_id=request_id,
        finish_reason=FinishReason.ERROR,
        error=message,
        num_prompt_tokens=num_prompt_tokens,
    )
