"""Fakes of the engine seams (`EngineClient`, `Tokenizer`) for unit tests of the API's pure logic.

They generate nothing real: `FakeEngineClient` replays a script of text pieces. Anything that
claims to generate text is tested against the real llama.cpp backend in tests/integration.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from llguidance import LLMatcher

from inferflux.config.settings import ObservabilitySettings, SchedulerSettings
from inferflux.engine.messages import (
    AddRequest,
    EngineStats,
    FinishReason,
    RequestDelta,
    StepStats,
    TicketStats,
    TokenLogprob,
)
from inferflux.engine.protocol import ChannelStats, EmbeddingResult, ModelInfo, WorkerStatus
from inferflux.errors import InvalidRequest, ModelLoadError

FAKE_VOCAB = 259  # 3 specials + 256 bytes
FAKE_BOS = 1
FAKE_N_EMBD = 4


class FakeTokenizer:
    """One token per UTF-8 byte (id = byte + 3); `<s>` is BOS (id 1). Records every call."""

    def __init__(self, chat_template: str | None = None) -> None:
        self._chat_template = chat_template
        self.calls: list[tuple[str, bool, bool]] = []

    @property
    def bos_text(self) -> str:
        return "<s>"

    @property
    def eos_text(self) -> str:
        return "</s>"

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.calls.append((text, add_special, parse_special))
        ids = [FAKE_BOS] if add_special else []
        if parse_special and text.startswith("<s>"):
            ids.append(FAKE_BOS)
            text = text[3:]
        return ids + [b + 3 for b in text.encode()]

    def detokenize(self, token_ids: list[int]) -> str:
        return bytes(t - 3 for t in token_ids if t >= 3).decode("utf-8", "replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id - 3]) if 3 <= token_id < 259 else b""

    def constraint_error(self, grammar: str) -> str | None:
        """llguidance's own check without a vocabulary (the fake has none to index)."""
        is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        return messages[0] if is_error else None


class FakePieceTokenizer(FakeTokenizer):
    """FakeTokenizer whose `token_bytes` reads a table (multi-byte tokens, for logprob
    alignment tests); ids missing from the table are special (b"")."""

    def __init__(self, pieces: dict[int, bytes]) -> None:
        super().__init__()
        self.pieces = pieces

    def token_bytes(self, token_id: int) -> bytes:
        return self.pieces.get(token_id, b"")


def fake_model_info(*, n_ctx: int = 256, architecture: str = "llama") -> ModelInfo:
    return ModelInfo(
        model_id="fake-model",
        path="/nonexistent/fake.gguf",
        architecture=architecture,
        n_ctx=n_ctx,
        n_ctx_train=n_ctx,
        n_vocab=FAKE_VOCAB,
        size_bytes=1234,
        created=1_700_000_000,
        has_chat_template=False,
        n_embd=FAKE_N_EMBD,
    )


@dataclass
class FakeEngineClient:
    """Replays `pieces` (one delta each, cut at max_tokens), then finishes with `finish`.

    Knobs: `ready`, `raise_on_submit` (raised before the first delta), `raise_after`
    (an exception raised after that many deltas), `hang_after` (wait forever after that many
    deltas, for disconnect tests), `error` (the final delta's error text),
    `num_cached_tokens` (reported on the final delta).

    A request that asks for logprobs gets FakeTokenizer's ids (one per byte of the piece),
    each with a made-up logprob and top list, and a STOP finish carries the end token (id 2)
    as the real engine does; `prompt_logprobs` come on the first delta.
    """

    pieces: list[str] = field(default_factory=lambda: ["Hello", ",", " world", "!"])
    finish: FinishReason = FinishReason.STOP
    error: str | None = None
    ready: bool = True
    raise_on_submit: Exception | None = None
    raise_after: tuple[int, Exception] | None = None
    hang_after: int | None = None
    requests: list[AddRequest] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    embedded: list[list[list[int]]] = field(default_factory=list)
    started: bool = False
    fail_start: str | None = None  # start() raises ModelLoadError with this message
    num_cached_tokens: int = 0
    stopped: bool = False
    step_observers: list[Callable[[int, StepStats], None]] = field(default_factory=list)
    reconfigured: list[tuple[SchedulerSettings, ObservabilitySettings]] = field(
        default_factory=list
    )
    scaled: list[int] = field(default_factory=list)  # every scale(n), in order
    scaled_roles: list[str | None] = field(default_factory=list)  # each scale's role
    # disaggregated mode: the KV channel's counters (None: unified) and the workers
    # `workers()` lists instead of its one unified worker
    channel_stats: ChannelStats | None = None
    statuses: list[WorkerStatus] | None = None

    async def start(self) -> None:
        self.started = True
        if self.fail_start is not None:
            raise ModelLoadError(self.fail_start)

    async def shutdown(self) -> None:
        self.stopped = True

    async def generate(self, request: AddRequest) -> AsyncIterator[RequestDelta]:
        if self.raise_on_submit is not None:
            raise self.raise_on_submit
        self.requests.append(request)
        try:
            pieces = self.pieces[: request.sampling.max_tokens]
            finish = self.finish
            if len(pieces) < len(self.pieces) and finish is FinishReason.STOP:
                finish = FinishReason.LENGTH
            for index, piece in enumerate(pieces):
                if self.raise_after is not None and index == self.raise_after[0]:
                    raise self.raise_after[1]
                if self.hang_after is not None and index == self.hang_after:
                    await asyncio.Event().wait()
                yield self._delta(request, piece, index + 1)
            yield self._delta(request, "", len(pieces), finish)
        finally:
            self.closed.append(request.request_id)

    def _delta(
        self, request: AddRequest, text: str, num_output: int, finish: FinishReason | None = None
    ) -> RequestDelta:
        delta = RequestDelta(
            request_id=request.request_id,
            text=text,
            token_ids=[7] if text else [],
            finish_reason=finish,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=num_output,
            num_cached_tokens=self.num_cached_tokens if finish is not None else 0,
            error=self.error if finish is FinishReason.ERROR else None,
        )
        k = request.sampling.logprobs
        if k is not None:
            delta.token_ids = [b + 3 for b in text.encode()]
            if finish is FinishReason.STOP:
                delta.token_ids.append(2)
            delta.logprobs = [_fake_logprob(t, k) for t in delta.token_ids]
        k = request.sampling.prompt_logprobs
        if k is not None and num_output <= 1 and finish is None:
            prompt = request.prompt_token_ids
            delta.prompt_logprobs = [None] + [_fake_logprob(t, k) for t in prompt[1:]]
        return delta

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def embed(self, inputs: list[list[int]], *, normalize: bool = True) -> EmbeddingResult:
        """One fake vector per input: [length, first id, last id, 1], normalized if asked."""
        if self.raise_on_submit is not None:
            raise self.raise_on_submit
        self.embedded.append(inputs)
        vectors = []
        for ids in inputs:
            vector = [float(len(ids)), float(ids[0]), float(ids[-1]), 1.0]
            norm = sum(x * x for x in vector) ** 0.5 if normalize else 1.0
            vectors.append([x / norm for x in vector])
        return EmbeddingResult(vectors, sum(len(ids) for ids in inputs))

    def workers(self) -> list[WorkerStatus]:
        if self.statuses is not None:
            return list(self.statuses)
        stats = EngineStats(num_running=1, num_steps=5)
        return [WorkerStatus(0, 4242, self.ready, 0, len(self.requests), stats, load_s=0.5)]

    async def scale(self, num_workers: int, role: str | None = None) -> list[WorkerStatus]:
        """Records the count and role; a role refused as WorkerPoolClient refuses it."""
        disaggregated = self.channel_stats is not None
        if role is not None and (not disaggregated or role not in ("prefill", "decode")):
            raise InvalidRequest(f"no '{role}' pool to scale", param="role")
        self.scaled.append(num_workers)
        self.scaled_roles.append(role)
        return self.workers()

    def channel(self) -> ChannelStats | None:
        return self.channel_stats

    def observe_steps(self, observer: Callable[[int, StepStats], None]) -> None:
        self.step_observers.append(observer)

    async def reconfigure(
        self, scheduler: SchedulerSettings, observability: ObservabilitySettings
    ) -> None:
        self.reconfigured.append((scheduler, observability))

    def emit_step(self, step: StepStats, worker_id: int = 0) -> None:
        """Deliver `step` to the observers, as the receive loop of the real client does."""
        for observer in self.step_observers:
            observer(worker_id, step)


def _fake_logprob(token_id: int, k: int) -> TokenLogprob:
    """The token at logprob -0.5; its top list: itself, then token_id + 1 at -1.5, ..."""
    top = [(token_id, -0.5)] + [(token_id + i, -0.5 - i) for i in range(1, k)]
    return TokenLogprob(token_id, -0.5, top[:k])


def pool_status(
    worker_id: int,
    role: str,
    *,
    ready: bool = True,
    num_waiting: int = 0,
    num_in_flight: int = 0,
    tickets: TicketStats | None = None,
    draining: bool = False,
) -> WorkerStatus:
    """A worker of a disaggregated pool as the real client lists it (for `statuses`)."""
    stats = EngineStats(num_waiting=num_waiting, role=role, tickets=tickets)
    return WorkerStatus(
        worker_id, 5000 + worker_id, ready, 0, num_in_flight, stats, draining=draining, role=role
    )


def fake_channel(**counts: int) -> ChannelStats:
    """The KV channel's counters (`FakeEngineClient.channel_stats`): zeros but `counts`."""
    fields = dict.fromkeys(ChannelStats.__dataclass_fields__, 0)
    return ChannelStats(**{**fields, "capacity": 8, **counts})
