"""`GuardedEngine`: the engine seam, under the security policy. Every generation and
embedding, whichever API submitted it, passes through it with the `RequestContext` of
the HTTP request it serves (its principal, its rate-limit status, its record).

Before anything is queued: a priority above the caller's `priority_cap` (the lower of
its key's and its tenant's) is lowered to the cap, the request's prefix-cache namespace
becomes its tenant's (unless the tenant shares its cache), the input guardrails run on the
detokenized prompt
(a redacted prompt is re-tokenized, special tokens kept), and the prompt's tokens are
charged to the token rate limits (RateLimited → 429, nothing queued). While it streams:
completion tokens are charged as they arrive (in batches, and whatever is left when the
stream ends, is cancelled or the client disconnects), and the output guardrails scan the
text; a block ends the stream with finish reason `content_filter`. Throughout it fills
the request's `RequestRecord` (counts always; text while the audit log wants it).

Lives in `api/` because it needs both `engine` (the EngineClient it wraps, the tokenizer)
and `security` (principal, policy, limits, guardrails), which never import each other.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import anyio
import msgspec

from inferflux.engine.messages import AddRequest, FinishReason, Priority, RequestDelta
from inferflux.engine.protocol import EmbeddingResult, Tokenizer
from inferflux.errors import InferfluxError, InvalidRequest
from inferflux.models.serving import ServedEngine, WrappingEngine
from inferflux.security.context import RequestContext, RequestRecord
from inferflux.security.guardrails import (
    DecisionContext,
    Guardrails,
    OutputBlocked,
    OutputScanner,
)
from inferflux.security.guardrails.chain import redact
from inferflux.security.policy import PolicySource
from inferflux.security.principal import Principal
from inferflux.security.rate_limit import RateLimitService, RateLimitStatus

_CHARGE_EVERY = 16  # completion tokens charged per limiter call while streaming


class _CompletionMeter:
    """Charges one generation's completion tokens as they are produced."""

    def __init__(
        self, limits: RateLimitService | None, principal: Principal, status: RateLimitStatus | None
    ) -> None:
        self._limits = limits
        self._principal = principal
        self._status = status
        self.num_produced = 0
        self._num_charged = 0

    async def update(self, num_produced: int) -> None:
        self.num_produced = max(self.num_produced, num_produced)
        if self.num_produced - self._num_charged >= _CHARGE_EVERY:
            await self.flush()

    async def flush(self) -> None:
        owed = self.num_produced - self._num_charged
        if owed > 0 and self._limits is not None:
            self._num_charged = self.num_produced
            await self._limits.charge_completion(self._principal, owed, self._status)


class GuardedEngine(WrappingEngine):
    """A served engine that applies the security policy to the one it wraps."""

    def __init__(
        self,
        inner: ServedEngine,
        *,
        tokenizer: Tokenizer,
        model: str,
        source: PolicySource,
        limits: RateLimitService | None,
        guardrails: Guardrails | None,
    ) -> None:
        super().__init__(inner)
        self.tokenizer = tokenizer
        self.model = model
        self.source = source
        self.limits = limits
        self.guardrails = guardrails

    async def generate(
        self, request: AddRequest, context: RequestContext
    ) -> AsyncIterator[RequestDelta]:
        principal, record, status = context.caller, context.record, context.rate_limit
        request = _capped(request, principal, record)
        request = self._namespaced(request, principal)
        scanner = self._output_scanner(request)
        if await self._redacts_input(request.prompt_token_ids, context):
            request = self._redacted(request)
        token_ids = request.prompt_token_ids
        if self.limits is not None:
            await self.limits.charge_prompt(principal, len(token_ids), status)
        record.model = self.model
        record.num_prompt_tokens += len(token_ids)
        meter = _CompletionMeter(self.limits, principal, status)
        deltas = self.inner.generate(request, context)
        try:
            async for delta in deltas:
                await meter.update(delta.num_output_tokens)
                out = self._filter(delta, scanner, record, meter.num_produced)
                _record_delta(record, out)
                yield out
                if out.finish_reason is not None:
                    return
        finally:
            with anyio.CancelScope(shield=True):
                if isinstance(deltas, AsyncGenerator):
                    await deltas.aclose()  # aborts an unfinished request
                await meter.flush()

    def _namespaced(self, request: AddRequest, principal: Principal) -> AddRequest:
        """Prefix-cache KV is reused only within one namespace: the tenant's, unless its
        policy shares the cache (CVE-2025-46570: a shared cache leaks prompts by timing)."""
        if self.source.current().tenant(principal.tenant).share_prefix_cache:
            return request
        namespace = f"{request.cache_namespace}|tenant:{principal.tenant}"
        return msgspec.structs.replace(request, cache_namespace=namespace)

    def _output_scanner(self, request: AddRequest) -> OutputScanner | None:
        scanner = self.guardrails.output_scanner() if self.guardrails is not None else None
        if scanner is not None and scanner.redacts and request.sampling.logprobs is not None:
            # NOTE: token logprobs would show the text that redaction hides.
            raise InvalidRequest(
                "logprobs are not available while output redaction (pii_action: redact) is on",
                param="logprobs",
            )
        return scanner

    async def _check_input(self, token_ids: list[int], context: RequestContext) -> list[int]:
        """Run the input guardrails on the prompt's text; the token ids to queue (the
        same list unless redaction changed the text). Raises what `_redacts_input` does."""
        if await self._redacts_input(token_ids, context) and self.guardrails is not None:
            return self._redacted_ids(token_ids, self.guardrails)
        return token_ids

    async def _redacts_input(self, token_ids: list[int], context: RequestContext) -> bool:
        """Run the input guardrails on the prompt's text; True when redaction changed it
        (the caller re-tokenizes). Raises ContentFiltered (400), PolicyDenied (403),
        PolicyUnavailable (503)."""
        guardrails, record = self.guardrails, context.record
        active = guardrails is not None and guardrails.chain().active
        if not active and not record.keep_text:
            return False
        text = self.tokenizer.detokenize(token_ids)
        record.set_prompt(text)
        if guardrails is None or not active:
            return False
        decision_context = DecisionContext(context.caller, self.model, context.route)
        try:
            verdict = await guardrails.check_input(text, decision_context)
        except InferfluxError as exc:
            record.add_decision(f"guardrail:input:{exc.code}")
            raise
        for decision in verdict.decisions:
            record.add_decision(decision)
        if not verdict.redacted:
            return False
        record.set_prompt(verdict.text)
        return True

    def _redacted(self, request: AddRequest) -> AddRequest:
        """`request` with its prompt redacted. With images, the text between two images
        is redacted on its own and each image moves to where its text now ends, so an
        image never lands inside re-tokenized text."""
        guardrails = self.guardrails
        if guardrails is None:
            return request
        tokens = request.prompt_token_ids
        out: list[int] = []
        moved = []
        start = 0
        for image in request.images:
            out += self._redacted_ids(tokens[start : image.position], guardrails)
            moved.append(msgspec.structs.replace(image, position=len(out)))
            start = image.position
        out += self._redacted_ids(tokens[start:], guardrails)
        return msgspec.structs.replace(request, prompt_token_ids=out, images=moved)

    def _redacted_ids(self, token_ids: list[int], guardrails: Guardrails) -> list[int]:
        """Re-tokenize each run of text tokens whose text redaction changes; special
        tokens (no text: BOS, chat-template markers) stay as they are. The new text is
        tokenized without special-token parsing, so it cannot inject any."""
        chain = guardrails.chain()
        out: list[int] = []
        run: list[int] = []

        def flush_run() -> None:
            if not run:
                return
            text = self.tokenizer.detokenize(run)
            redacted = redact(text, chain.find(text))
            if redacted == text:
                out.extend(run)
            else:
                out.extend(
                    self.tokenizer.tokenize(redacted, add_special=False, parse_special=False)
                )
            run.clear()

        for token_id in token_ids:
            if self.tokenizer.token_bytes(token_id):
                run.append(token_id)
            else:
                flush_run()
                out.append(token_id)
        flush_run()
        return out

    def _filter(
        self,
        delta: RequestDelta,
        scanner: OutputScanner | None,
        record: RequestRecord,
        num_produced: int,
    ) -> RequestDelta:
        """`delta` as the client may see it: text scanned (held back, redacted), or the
        final `content_filter` delta when the output hit a block."""
        if scanner is None:
            return delta
        try:
            text = scanner.feed(delta.text, final=delta.finish_reason is not None)
        except OutputBlocked as blocked:
            record.add_decision(f"guardrail:{blocked.rule}:block")
            return RequestDelta(
                request_id=delta.request_id,
                finish_reason=FinishReason.CONTENT_FILTER,
                num_prompt_tokens=delta.num_prompt_tokens,
                num_output_tokens=num_produced,
                num_cached_tokens=delta.num_cached_tokens,
            )
        if scanner.redacts:
            # NOTE: token ids would show what redaction hides (Ollama's `context`).
            return msgspec.structs.replace(delta, text=text, token_ids=[], logprobs=None)
        return msgspec.structs.replace(delta, text=text)

    async def embed(
        self, inputs: list[list[int]], context: RequestContext, *, normalize: bool = True
    ) -> EmbeddingResult:
        """Embeddings pass the input guardrails and count against the token limits."""
        checked = [await self._check_input(ids, context) for ids in inputs]
        num_tokens = sum(len(ids) for ids in checked)
        if self.limits is not None:
            await self.limits.charge_prompt(context.caller, num_tokens, context.rate_limit)
        context.record.model = self.model
        context.record.num_prompt_tokens += num_tokens
        return await self.inner.embed(checked, context, normalize=normalize)


_RANK = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2}


def _capped(request: AddRequest, principal: Principal, record: RequestRecord) -> AddRequest:
    """`request` at the caller's `priority_cap` when it asked for more (recorded as the
    decision `priority_cap:<cap>`); the scheduler, metrics and /debug see the cap."""
    cap = principal.priority_cap
    if cap is None or _RANK[request.priority] <= _RANK[Priority(cap)]:
        return request
    record.add_decision(f"priority_cap:{cap}")
    return msgspec.structs.replace(request, priority=Priority(cap))


def _record_delta(record: RequestRecord, delta: RequestDelta) -> None:
    if delta.text:
        record.add_completion(delta.text)
    if delta.finish_reason is not None:
        record.finish_reason = str(delta.finish_reason)
        record.num_completion_tokens += delta.num_output_tokens
        record.num_cached_tokens += delta.num_cached_tokens
        record.num_cache_hits += 1 if delta.num_cached_tokens > 0 else 0
