"""What the API needs of one resident model: `ServingState`, and its engine as the API
sees it: `ServedEngine`.

`ServedEngine` is the engine seam with the request in it: `generate` and `embed` take the
`RequestContext` of the HTTP request they serve, so the wrappers that apply the security
policy and observe every generation (api/guarded_engine.py, api/observed_engine.py) get
their inputs as arguments. `ClientEngine` adapts a plain `EngineClient` (the innermost
layer drops the context); `WrappingEngine` is the forwarding base of a wrapper, which
overrides only what it changes. Does not own which models exist or are resident
(models/hub.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from inferflux.config.manifest import ModelParameters
from inferflux.config.settings import ObservabilitySettings, SchedulerSettings, Settings
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.messages import AddRequest, RequestDelta, StepStats
from inferflux.engine.protocol import (
    ChannelStats,
    EmbeddingResult,
    EngineClient,
    ModelInfo,
    Tokenizer,
    WorkerStatus,
)
from inferflux.security.context import RequestContext


class EngineControl(Protocol):
    """The members a served engine shares with its `EngineClient`: lifecycle, workers,
    aborts (see engine/protocol.py for each one's contract)."""

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    def workers(self) -> list[WorkerStatus]: ...

    async def scale(self, num_workers: int, role: str | None = None) -> list[WorkerStatus]: ...

    def observe_steps(self, observer: Callable[[int, StepStats], None]) -> None: ...

    def channel(self) -> ChannelStats | None: ...

    async def reconfigure(
        self, scheduler: SchedulerSettings, observability: ObservabilitySettings
    ) -> None: ...


class ServedEngine(EngineControl, Protocol):
    """A model's engine as the generation service sees it: `EngineClient`'s contract, each
    generation and embedding under one request's context."""

    def generate(self, request: AddRequest, context: RequestContext) -> AsyncIterator[RequestDelta]:
        """`EngineClient.generate` for the request `context` describes."""
        ...

    async def embed(
        self, inputs: list[list[int]], context: RequestContext, *, normalize: bool = True
    ) -> EmbeddingResult:
        """`EngineClient.embed` for the request `context` describes."""
        ...


class _Forwarding:
    """Forwards the `EngineControl` members to `control`."""

    def __init__(self, control: EngineControl) -> None:
        self._control = control

    @property
    def ready(self) -> bool:
        return self._control.ready

    async def start(self) -> None:
        await self._control.start()

    async def shutdown(self) -> None:
        await self._control.shutdown()

    async def abort(self, request_id: str) -> None:
        await self._control.abort(request_id)

    def workers(self) -> list[WorkerStatus]:
        return self._control.workers()

    async def scale(self, num_workers: int, role: str | None = None) -> list[WorkerStatus]:
        return await self._control.scale(num_workers, role)

    def observe_steps(self, observer: Callable[[int, StepStats], None]) -> None:
        self._control.observe_steps(observer)

    def channel(self) -> ChannelStats | None:
        return self._control.channel()

    async def reconfigure(
        self, scheduler: SchedulerSettings, observability: ObservabilitySettings
    ) -> None:
        await self._control.reconfigure(scheduler, observability)


class ClientEngine(_Forwarding):
    """The innermost served engine: an `EngineClient`, which needs no request context."""

    def __init__(self, client: EngineClient) -> None:
        super().__init__(client)
        self.client = client

    def generate(self, request: AddRequest, context: RequestContext) -> AsyncIterator[RequestDelta]:
        return self.client.generate(request)

    async def embed(
        self, inputs: list[list[int]], context: RequestContext, *, normalize: bool = True
    ) -> EmbeddingResult:
        return await self.client.embed(inputs, normalize=normalize)


class WrappingEngine(_Forwarding):
    """The base of a wrapper: forwards everything to `inner`; subclasses override what
    they change."""

    def __init__(self, inner: ServedEngine) -> None:
        super().__init__(inner)
        self.inner = inner

    def generate(self, request: AddRequest, context: RequestContext) -> AsyncIterator[RequestDelta]:
        return self.inner.generate(request, context)

    async def embed(
        self, inputs: list[list[int]], context: RequestContext, *, normalize: bool = True
    ) -> EmbeddingResult:
        return await self.inner.embed(inputs, context, normalize=normalize)


@dataclass(frozen=True, slots=True)
class ServingState:
    """Everything the API needs of one resident model. Immutable; the engine is
    async-safe."""

    settings: Settings  # the model's own (per-model values applied)
    engine: ServedEngine
    tokenizer: Tokenizer
    model_info: ModelInfo
    chat_template: ChatTemplate
    constraints: ConstraintCompiler  # response_format / grammar → llguidance grammars
    system_fingerprint: str
    started_at: float  # time.monotonic() when the model started serving
    system: str | None = None  # Ollama: the system prompt when a request sends none
    parameters: ModelParameters | None = None  # Ollama: default options


# How the API sees a model's engine (api/app.py builds it: observed, then guarded).
EngineWrapper = Callable[[EngineClient, Tokenizer, ModelInfo], ServedEngine]
