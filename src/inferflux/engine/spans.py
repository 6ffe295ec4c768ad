"""`EngineSpans`: the worker's half of a request's trace (queue → prefill → decode).

Owns: the trace context each traced `AddRequest` carried, and turning a finished
request's `RequestPhases` into spans under it, after the fact, with the phase stamps as
span times. Nothing is created while the request runs, so the engine loop pays one dict
insert per traced request and nothing per token. Used only when tracing is on.
Thread rule: the worker thread only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import StatusCode

from inferflux.engine.messages import RequestPhases
from inferflux.observability.tracing import (
    ATTR_CACHED_TOKENS,
    ATTR_FINISH_REASONS,
    ATTR_INPUT_TOKENS,
    ATTR_OUTPUT_TOKENS,
    ATTR_PRIORITY,
    ATTR_REQUEST_ID,
    ATTR_WORKER,
    extract_context,
)

_FAILED = frozenset({"error", "timeout"})


class EngineSpans:
    """Spans of the requests one worker ran, each under the trace its API span started."""

    def __init__(self, tracer: trace.Tracer, worker_id: int) -> None:
        self._tracer = tracer
        self._worker_id = worker_id
        self._contexts: dict[str, dict[str, str]] = {}

    def on_added(self, request_id: str, carrier: dict[str, str] | None) -> None:
        """Remember a queued request's trace context (requests without one get no spans)."""
        if carrier:
            self._contexts[request_id] = carrier

    def on_transfers(self, transfers: Iterable[tuple[str, int, int, int]]) -> None:
        """Spans of KV hand-offs this (decode) worker hydrated: (request id, enqueued and
        hydrated Unix ns, ticket bytes), each `inferflux.kv_transfer` from the prefill
        worker's enqueue to this worker's hydrate, in the request's trace."""
        for request_id, start_ns, end_ns, nbytes in transfers:
            carrier = self._contexts.get(request_id)
            if carrier is None:
                continue
            span = self._tracer.start_span(
                "inferflux.kv_transfer",
                context=extract_context(carrier),
                start_time=start_ns,
                attributes={
                    ATTR_REQUEST_ID: request_id,
                    ATTR_WORKER: self._worker_id,
                    "inferflux.kv_transfer.bytes": nbytes,
                },
            )
            span.end(end_time=max(start_ns, end_ns))

    def on_finished(self, finished: Iterable[RequestPhases]) -> None:
        """Emit the spans of these finished requests, and forget them."""
        # Worker stamps are time.monotonic(); spans want Unix nanoseconds.
        offset_ns = time.time_ns() - time.monotonic_ns()
        for phases in finished:
            carrier = self._contexts.pop(phases.request_id, None)
            if carrier is not None:
                self._emit(phases, carrier, offset_ns)

    def _emit(self, p: RequestPhases, carrier: dict[str, str], offset_ns: int) -> None:
        def ns(stamp: float) -> int:
            return int(stamp * 1e9) + offset_ns

        engine = self._tracer.start_span(
            "inferflux.engine",
            context=extract_context(carrier),
            start_time=ns(p.added_at),
            attributes={
                ATTR_REQUEST_ID: p.request_id,
                ATTR_WORKER: self._worker_id,
                ATTR_PRIORITY: p.priority,
                ATTR_INPUT_TOKENS: p.num_prompt_tokens,
                ATTR_CACHED_TOKENS: p.num_cached_tokens,
                ATTR_OUTPUT_TOKENS: p.num_output_tokens,
                ATTR_FINISH_REASONS: [p.finish_reason],
            },
        )
        parent = trace.set_span_in_context(engine)
        queued_until = p.scheduled_at if p.scheduled_at is not None else p.finished_at
        self._child("inferflux.queue", parent, ns(p.added_at), ns(queued_until))
        if p.scheduled_at is not None:
            prefill_end = p.first_token_at if p.first_token_at is not None else p.finished_at
            self._child("inferflux.prefill", parent, ns(p.scheduled_at), ns(prefill_end))
        if p.first_token_at is not None:
            self._child("inferflux.decode", parent, ns(p.first_token_at), ns(p.finished_at))
        if p.finish_reason in _FAILED:
            engine.set_status(StatusCode.ERROR, p.finish_reason)
        engine.end(end_time=ns(p.finished_at))

    def _child(self, name: str, parent: Context, start_ns: int, end_ns: int) -> None:
        span = self._tracer.start_span(name, context=parent, start_time=start_ns)
        span.end(end_time=end_ns)
