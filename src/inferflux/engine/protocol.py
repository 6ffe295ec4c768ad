"""The seams between the API process and the engine: `EngineClient`, `Tokenizer`, `ModelInfo`.

The API layer depends on these Protocols only. `engine/client.py` implements
`EngineClient` over worker processes (or a thread, in-process mode); the llama.cpp
backend implements `Tokenizer` with a vocab-only model load.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from inferflux.config.settings import ObservabilitySettings, SchedulerSettings
from inferflux.engine.messages import AddRequest, EngineStats, RequestDelta, StepStats
from inferflux.engine.routing import WorkerRouting

MAX_WORKERS = 64  # workers of one model: `EngineClient.scale` bound, as runtime.workers


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A LoRA adapter (GGUF) applied to every sequence of a model's workers."""

    adapter_id: str
    path: str
    sha256: str  # checked by every process before llama.cpp reads the file
    scale: float = 1.0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the API needs to know about the served model."""

    model_id: str
    path: str
    architecture: str
    n_ctx: int  # per-request context (prompt + generated tokens), in tokens
    n_ctx_train: int
    n_vocab: int
    size_bytes: int
    created: int  # file mtime, unix seconds (OpenAI `created`)
    has_chat_template: bool  # True when the GGUF carries `tokenizer.chat_template`
    n_embd: int = 0  # embedding width (GGUF `<arch>.embedding_length`); 0 = unknown
    aliases: tuple[str, ...] = ()  # other names requests may use for this model
    sha256: str = ""  # verified by every process before llama.cpp reads the file; "" = none
    num_parameters: int = 0  # from the GGUF tensor shapes; 0 = unknown
    quantization: str = "unknown"  # Q4_K_M, F16, ... (GGUF general.file_type)
    n_experts: int = 0  # MoE experts per layer (GGUF `<arch>.expert_count`); 0 = dense
    n_active_experts: int = 0  # MoE experts used per token (`<arch>.expert_used_count`)
    adapters: tuple[LoraAdapter, ...] = ()  # LoRA applied on top of the base weights
    base_model_id: str = ""  # with adapters: the id of the base model ("" otherwise)
    mmproj: str = ""  # multimodal projector GGUF (images in); "" = text only
    mmproj_sha256: str = ""  # verified like `sha256` before libmtmd reads the file

    @property
    def vision(self) -> bool:
        """True when the model takes images (it has an mmproj)."""
        return bool(self.mmproj)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def access_names(self) -> tuple[str, ...]:
        """The names a principal's `allowed_models` can grant this model by: its id, and
        for a LoRA adapter model its base model's id (an allowed base allows its adapters)."""
        base = self.base_model_id
        return (self.model_id, base) if base else (self.model_id,)

    def serves(self, name: str | None) -> bool:
        """True when `name` (the request's `model`) is this model's id or an alias."""
        if name is None or name == self.model_id or name in self.aliases:
            return True
        return bool(self.base_model_id) and name == self.base_model_id  # + `adapter` field


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    """The vectors of one `EngineClient.embed` call, one per input, in input order."""

    vectors: list[list[float]]
    num_prompt_tokens: int  # tokens embedded, over all inputs


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One worker as the API process sees it."""

    worker_id: int
    pid: int | None
    ready: bool
    restarts: int
    num_in_flight: int
    stats: EngineStats
    load_s: float | None = None  # seconds its latest start took to load the model
    routing: WorkerRouting | None = None  # the API side's routing counters of this worker
    hangs: int = 0  # times this worker stopped answering and was killed and replaced
    draining: bool = False  # removed by runtime scaling: finishing its requests, then gone
    backend: str = "cpu"  # where its model runs ("cpu", "cuda", ...)
    requested_backend: str = "cpu"  # what runtime.n_gpu_layers asked for
    fallback_reason: str | None = None  # why backend != requested_backend (GPU → CPU)
    role: str = "unified"  # "prefill" | "decode" in disaggregated mode (scheduler.mode)


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """The KV channel between the prefill and decode pools (disaggregated mode), as the
    API process counts it since start (engine/kv_channel.py)."""

    capacity: int  # scheduler.disaggregated.channel_capacity
    in_flight: int  # tickets reserved: prefilling, written, or waiting to be hydrated
    in_flight_bytes: int  # their estimated shared-memory bytes
    prefill_queue: int  # requests sent to the prefill pool and not handed off yet
    handed_off: int  # tickets a prefill worker wrote and a decode worker was given
    blocked: int  # requests that waited past ticket_wait_s for a full channel
    direct: int  # requests run on a decode worker without the prefill pool (short
    # prompt, images, prompt logprobs, no prefill worker ready, or blocked)
    resubmitted: int  # hand-offs retried after a worker died before its first token


class Tokenizer(Protocol):
    """Text ⇄ token ids for one model. Thread-safe for reads; never touches a context."""

    @property
    def bos_text(self) -> str: ...

    @property
    def eos_text(self) -> str: ...

    @property
    def chat_template(self) -> str | None: ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of `text`; `add_special` adds BOS/EOS as the model wants them."""
        ...

    def detokenize(self, token_ids: list[int]) -> str:
        """Text of `token_ids`, special tokens rendered as empty."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character; b"" if special)."""
        ...

    def constraint_error(self, grammar: str) -> str | None:
        """None when the engine can enforce `grammar` (an llguidance grammar from
        engine/grammar.py) over this vocabulary, else why not. May take up to a few hundred
        ms for a large grammar (and about 1 s the first time, to index the vocabulary)."""
        ...


class EngineClient(Protocol):
    """How the API process talks to the engine. Async only; safe on one event loop."""

    @property
    def ready(self) -> bool:
        """True while at least one worker takes requests."""
        ...

    async def start(self) -> None:
        """Start the workers and return once one is ready (raises ModelLoadError if none)."""
        ...

    async def shutdown(self) -> None:
        """Abort everything and stop the workers."""
        ...

    def generate(self, request: AddRequest) -> AsyncIterator[RequestDelta]:
        """Submit `request` and yield its deltas until one carries a finish_reason.

        Closing the iterator early (client disconnect) aborts the request in the
        engine. Raises NoWorkerReady before submitting when no worker is ready, and
        EngineDeadError if the worker dies mid-request.
        """
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request at the engine's next step. Unknown ids are ignored."""
        ...

    async def embed(self, inputs: list[list[int]], *, normalize: bool = True) -> EmbeddingResult:
        """One pooled (mean) vector per token list, L2-normalized unless `normalize` is
        False. Inputs must be non-empty, in the vocabulary and no longer than the context
        (the API checks). Raises NoWorkerReady when no worker is ready, EngineDeadError if
        the worker dies first, EngineError if the engine rejects the inputs. Cancelling
        the call drops the request in the engine."""
        ...

    def workers(self) -> list[WorkerStatus]:
        """A snapshot of every worker."""
        ...

    async def scale(self, num_workers: int, role: str | None = None) -> list[WorkerStatus]:
        """Runtime scaling: run `num_workers` workers from now on (1..MAX_WORKERS). New
        workers get new ids and are waited for (up to runtime.worker_start_timeout_s);
        removed ones (fewest in flight first) leave rotation at once and finish their
        requests in the background (runtime.worker_drain_timeout_s), then stop. Returns
        the workers after the change (the removed ones `draining`). Lasts until restart.
        `role` picks the pool: None = the one requests stream from (unified, or decode in
        disaggregated mode), "prefill" or "decode" that pool; a role in unified mode, or
        another name, raises InvalidRequest(param="role")."""
        ...

    def observe_steps(self, observer: Callable[[int, StepStats], None]) -> None:
        """Call `observer(worker_id, stats)` on the event loop for every `StepStats` a
        worker sends (metrics, /debug phases). Observers must be quick and not raise."""
        ...

    def channel(self) -> ChannelStats | None:
        """The prefill → decode KV channel's counters; None in unified mode."""
        ...

    async def reconfigure(
        self, scheduler: SchedulerSettings, observability: ObservabilitySettings
    ) -> None:
        """Live tuning (PATCH /v1/admin/config): apply the new scheduler knobs and log
        policy to every worker, now and after restarts. The step budget never exceeds the
        batch the contexts were made with."""
        ...
