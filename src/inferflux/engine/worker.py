"""The worker loop: drive `EngineCore.step()`, take messages over ZeroMQ, send frames.

Owns: building the engine from a picklable `WorkerConfig`, the receive → step → send
loop, and exiting when the API process is gone. Does not own: any engine logic (core.py).
The same `run_worker` runs in a spawned process (default) or on a thread (in-process
mode); only `WorkerConfig.exit_with_parent` and signal handling differ.

Per step the worker sends at most one `StepOutputs`, carrying the deltas of every
request that changed. While idle it blocks on the input socket. Embedding requests queue
in an `EmbedQueue`; it runs one bounded forward pass after each step and each finished
request leaves as one `EmbedResult`. A heartbeat thread (heartbeat.py) answers the API's
health pings, also during a long step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from inferflux.config.kv_settings import KvPersistenceSettings, NvmeOffloadSettings, PagedKvSettings
from inferflux.config.settings import (
    ObservabilitySettings,
    SchedulerSettings,
    Settings,
    prefix_cache_slots,
)
from inferflux.config.speculative_settings import SpeculativeSettings
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend, gpu_support
from inferflux.engine.backends.llama_cpp_embed import EmbedContextConfig, LlamaCppEmbedder
from inferflux.engine.backends.offload import (
    GpuFault,
    OffloadPlan,
    choose_backend,
    load_with_fallback,
    log_plan,
)
from inferflux.engine.core import EngineCore, sampler_spec
from inferflux.engine.embed_queue import EmbeddingBackend, EmbedOutcome, EmbedQueue
from inferflux.engine.frames import ChannelClosed, FrameWriter
from inferflux.engine.heartbeat import Heartbeat, StepClock
from inferflux.engine.image_prep import ImagePreparer, ImageRows
from inferflux.engine.kv_channel import KvChannelEnd, ticket_model_id
from inferflux.engine.kv_setup import build_kv_offload, model_identity, tiers_enabled
from inferflux.engine.messages import (
    AbortRequests,
    AddRequest,
    EmbedRequest,
    EmbedResult,
    EngineInput,
    EngineOutput,
    Priority,
    Reconfigure,
    RequestDelta,
    SamplingParams,
    Shutdown,
    StepOutputs,
    WorkerFailed,
    WorkerReady,
    decode_input,
    encode,
)
from inferflux.engine.model_verify import verified_file, verify_mmproj
from inferflux.engine.protocol import LoraAdapter, ModelInfo
from inferflux.engine.spans import EngineSpans
from inferflux.engine.spec_cost import calibrated_step_cost, record_key
from inferflux.engine.spec_draft import DraftModelProposer, check_same_vocab
from inferflux.engine.speculative import NgramProposer, SpecConfig, StepCost
from inferflux.engine.stream_buffer import StreamBuffer
from inferflux.errors import EngineError, InferfluxError, ModelLoadError
from inferflux.observability.logging import configure_logging, update_log_policy
from inferflux.observability.tracing import get_tracer, make_tracer_provider
from inferflux.scheduler import Scheduler
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import PriorityClass

logger = logging.getLogger(__name__)

_IDLE_POLL_MS = 250
# An embedding pass beside generations lasts about one engine step, at least this long;
# alone but within the interactive window of the last generation step, at most about this
# long (a full 512-token pass is a second or more on 2 cores).
_MIN_EMBED_PASS_S = 0.005
_IDLE_EMBED_PASS_S = 0.25
_INTERACTIVE_WINDOW_S = 10.0
_SEND_GIVE_UP_S = 30.0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything a worker needs; pickled into spawned processes."""

    worker_id: int
    generation: int
    input_address: str
    output_address: str
    context: ContextConfig
    max_num_seqs: int
    max_batch_tokens: int
    observability: ObservabilitySettings
    exit_with_parent: bool = True
    scheduling: SchedulerSettings = field(default_factory=SchedulerSettings)  # type: ignore[arg-type]
    model_sha256: str = ""  # checked before llama.cpp reads the file; "" = no check
    adapters: tuple[LoraAdapter, ...] = ()  # verified like the model, then applied
    health_address: str = ""  # where the heartbeat thread takes pings; "" = no heartbeat
    # the prefix cache's host and disk tiers, and their persistence (kv_setup.py)
    paged_kv: PagedKvSettings = field(default_factory=PagedKvSettings)  # type: ignore[arg-type]
    nvme_offload: NvmeOffloadSettings = field(
        default_factory=NvmeOffloadSettings  # type: ignore[arg-type]
    )
    kv_persistence: KvPersistenceSettings = field(
        default_factory=KvPersistenceSettings  # type: ignore[arg-type]
    )
    speculative: SpecConfig | None = None  # speculative decoding; None = off
    # the prefix cache's sequence slots after the running ones (worker_config resolves
    # scheduler.prefix_cache.slots); None: every one the context has beyond them. 0: the
    # index alone, over parked slots and the lower tiers
    cache_slots: int | None = None
    gpu_fallback: bool = True  # runtime.gpu_fallback (engine/backends/offload.py)
    fault_gpu_init: GpuFault = "off"  # fault injection: runtime.fault_gpu_init
    cpu_fallback_reason: str | None = None  # set: the API process restarts this one on CPU
    mmproj: str = ""  # the model's multimodal projector (images in); "" = text only
    mmproj_sha256: str = ""  # checked before libmtmd reads the file; "" = no check
    image_max_pixels: int = 33_177_600  # multimodal.max_pixels (decode refuses more)
    role: str = "unified"  # "prefill" | "decode": disaggregated mode (engine/kv_channel.py)
    cpus: tuple[int, ...] = ()  # pin the process to these CPUs (sched_setaffinity); () = not


def worker_config(
    settings: Settings,
    model_info: ModelInfo,
    *,
    worker_id: int = 0,
    generation: int = 1,
    input_address: str = "",
    output_address: str = "",
    exit_with_parent: bool = True,
    health_address: str = "",
) -> WorkerConfig:
    """The WorkerConfig of one worker of `inferflux serve` with these settings."""
    runtime, scheduler = settings.runtime, settings.scheduler
    n_threads = runtime.n_threads or max(1, (os.cpu_count() or 1) // runtime.workers)
    cache_slots = prefix_cache_slots(runtime, scheduler.prefix_cache)
    n_cells = None
    if runtime.kv_cache_sizing == "tokens":  # the running contexts + the cache's budget
        cache_cells = scheduler.prefix_cache.max_tokens or model_info.n_ctx
        n_cells = model_info.n_ctx * scheduler.max_num_seqs + (cache_cells if cache_slots else 0)
    context = ContextConfig(
        model_path=model_info.path,
        n_ctx_per_seq=model_info.n_ctx,
        n_seq_max=scheduler.max_num_seqs + cache_slots,
        n_batch=scheduler.max_batch_tokens,
        n_threads=n_threads,
        n_threads_batch=runtime.n_threads_batch or n_threads,
        kv_unified=runtime.kv_unified,
        n_gpu_layers=runtime.n_gpu_layers,
        swa_full=runtime.swa_full,
        n_cells=n_cells,
    )
    return WorkerConfig(
        worker_id=worker_id,
        generation=generation,
        input_address=input_address,
        output_address=output_address,
        context=context,
        max_num_seqs=scheduler.max_num_seqs,
        max_batch_tokens=scheduler.max_batch_tokens,
        observability=settings.observability,
        exit_with_parent=exit_with_parent,
        scheduling=scheduler,
        model_sha256=model_info.sha256,
        adapters=model_info.adapters,
        health_address=health_address,
        paged_kv=runtime.paged_kv,
        nvme_offload=runtime.nvme_offload,
        kv_persistence=runtime.kv_persistence,
        speculative=spec_config(runtime.speculative_decoding),
        cache_slots=cache_slots,
        gpu_fallback=runtime.gpu_fallback,
        fault_gpu_init=runtime.fault_gpu_init,
        mmproj=model_info.mmproj,
        mmproj_sha256=model_info.mmproj_sha256,
        image_max_pixels=settings.multimodal.max_pixels,
    )


def spec_config(settings: SpeculativeSettings) -> SpecConfig | None:
    """The engine's speculative settings, or None when off."""
    if not settings.enabled:
        return None
    return SpecConfig(
        max_draft_tokens=settings.max_draft_tokens,
        max_prefill=settings.max_prefill,
        min_acceptance=settings.min_acceptance,
        max_batch=settings.max_batch,
        probe_after=settings.probe_after,
        cost=_fixed_cost(settings),
        cost_record=settings.cost_record or None,
        draft_model=settings.draft_model if settings.mode == "draft" else None,
    )


def _fixed_cost(settings: SpeculativeSettings) -> StepCost | None:
    """The configured row costs; None (measured at start) when neither is set. One set
    alone keeps the other at its 2-core CPU value."""
    second, extra = settings.second_row_cost, settings.extra_row_cost
    if second is None and extra is None:
        return None
    default = StepCost()
    return StepCost(
        default.second_row if second is None else second,
        default.extra_row if extra is None else extra,
    )


def scheduling_policy(settings: SchedulerSettings) -> SchedulingPolicy:
    """The scheduler's runtime knobs from the `scheduler` config section."""
    fairness = settings.fairness
    return SchedulingPolicy(
        queue_timeout_s=settings.queue_timeout_s,
        aging_s=settings.aging_s,
        batch_window_s=settings.batch_window_ms / 1000.0,
        enable_preemption=fairness.enable_preemption,
        high_priority_threshold=PriorityClass[fairness.high_priority_threshold.upper()],
        max_timeslice_tokens=fairness.max_timeslice_tokens,
        high_traffic_chunk_tokens=fairness.high_traffic_chunk_tokens,
        interrupt_steps=fairness.interrupt_steps,
        high_prefill_alone=fairness.high_prefill_alone,
        itl_target_s=settings.itl_target_ms / 1000.0,
        itl_target_ratio=settings.itl_target_ratio,
        burst_stall_s=settings.burst_stall_ms / 1000.0,
        memory_low_bytes=settings.memory_low_mb * 1024 * 1024,
    )


def _prefix_cache(config: WorkerConfig) -> PrefixCache | None:
    """The cache index over the sequence slots after the running ones, or None if off."""
    settings = config.scheduling.prefix_cache
    first = config.max_num_seqs
    # Only the sequences the context has beyond the running ones (worker_config adds them).
    slots = config.context.n_seq_max - first
    cap = config.cache_slots if config.cache_slots is not None else settings.slots
    if cap is not None:
        slots = min(cap, slots)
    if not settings.enabled or (slots <= 0 and config.cache_slots != 0):
        return None
    context = config.context
    if context.n_cells is not None:  # sized by tokens: the cells beyond the running ones
        budget = context.n_cells - config.max_num_seqs * context.n_ctx_per_seq
    else:
        budget = settings.max_tokens or int(0.8 * slots * context.n_ctx_per_seq)
    return PrefixCache(
        list(range(first, first + slots)),
        max_tokens=budget,
        min_match=settings.min_match_tokens,
        namespace_max_tokens=settings.tenant_max_tokens,
    )


def build_engine_core(config: WorkerConfig) -> EngineCore:
    """Verify and load the model, and wire backend + scheduler. Raises ModelLoadError
    (ModelVerificationFailed when the file no longer matches its SHA-256)."""
    path = config.context.model_path
    model_id = ""
    if tiers_enabled(config.paged_kv, config.nvme_offload):
        digest_dir = config.nvme_offload.path  # None: host RAM only, no hashing
        model_id = model_identity(
            path,
            config.model_sha256,
            tuple((a.path, a.scale) for a in config.adapters),
            Path(digest_dir) if digest_dir else None,
        )
    with contextlib.ExitStack() as files:
        load_path = files.enter_context(verified_file(path, config.model_sha256 or None))
        names = {load_path: path}
        lora = []
        for adapter in config.adapters:
            adapter_path = files.enter_context(verified_file(adapter.path, adapter.sha256))
            names[adapter_path] = adapter.path
            lora.append((adapter_path, adapter.scale))
        context = dataclasses.replace(config.context, model_path=load_path, lora=tuple(lora))
        try:
            backend = _load_backend(config, context)
        except ModelLoadError as exc:  # name the files, not /proc/self/fd/N
            message = exc.message
            for fd_path, real in names.items():
                message = message.replace(fd_path, real)
            raise ModelLoadError(message) from None
        images = _image_preparer(config, backend, files)
    cache = _prefix_cache(config)
    kv_capacity: int | None = None
    if config.context.kv_unified:
        # Cached prefixes hold cells of the shared buffer too: keep their budget out.
        kv_capacity = backend.n_ctx_total - (cache.max_tokens if cache is not None else 0)
    scheduler = Scheduler(
        max_num_seqs=config.max_num_seqs,
        max_batch_tokens=config.max_batch_tokens,
        kv_capacity=kv_capacity,
        policy=scheduling_policy(config.scheduling),
        prefix_cache=cache,
        park=config.scheduling.prefix_cache.reuse_in_place,
    )
    offload = build_kv_offload(
        backend,
        cache,
        model_id=model_id,
        worker_id=config.worker_id,
        paged_kv=config.paged_kv,
        nvme=config.nvme_offload,
        persistence=config.kv_persistence,
    )
    if offload is not None:
        scheduler.lower_tiers = offload
    speculator = _speculator(config, backend)
    channel = None
    if config.role != "unified":
        adapters = tuple((a.path, a.sha256, a.scale) for a in config.adapters)
        channel = KvChannelEnd(backend, ticket_model_id(path, config.model_sha256, adapters))
    return EngineCore(
        backend,
        scheduler,
        speculator,
        kv_offload=offload,
        images=images,
        channel=channel,
        role=config.role,
    )


def _image_preparer(
    config: WorkerConfig, backend: LlamaCppBackend, files: contextlib.ExitStack
) -> ImagePreparer | None:
    """The model's mmproj loaded (libmtmd) beside it, or None for a text-only model. The
    file is verified like the model's; libmtmd reads it once, here."""
    if not config.mmproj:
        return None
    from inferflux.engine.backends.llama_cpp_vision import VisionEncoder  # libmtmd: lazily

    load_path = files.enter_context(verify_mmproj(config.mmproj, config.mmproj_sha256 or None))
    try:
        # Half the batch threads: the tower runs beside decode steps (1 on 2 cores, where
        # 2 stalled in ggml's barrier: docs/engine-notes.md)
        encoder = VisionEncoder(
            load_path,
            backend.model_handle,
            n_threads=max(1, config.context.n_threads_batch // 2),
            use_gpu=config.context.n_gpu_layers != 0,
        )
    except EngineError as exc:
        message = exc.message.replace(load_path, config.mmproj)
        raise ModelLoadError(f"the mmproj {config.mmproj} cannot be used: {message}") from None
    rows = ImageRows()
    backend.image_rows = rows.embeddings
    backend.image_non_causal = encoder.non_causal
    backend.image_n_embd = encoder.n_embd
    stat = os.stat(config.mmproj)
    mmproj_id = config.mmproj_sha256 or f"{config.mmproj}:{stat.st_size}:{stat.st_mtime_ns}"
    return ImagePreparer(
        encoder,
        mmproj_id=mmproj_id,
        max_pixels=config.image_max_pixels,
        rows=rows,
        max_chunk_rows=backend.max_image_rows,
        n_ctx=config.context.n_ctx_per_seq,
    )


def _load_backend(config: WorkerConfig, context: ContextConfig) -> LlamaCppBackend:
    """The model on the backend the offload seam picks (engine/backends/offload.py): on
    CPU when the GPU cannot be used or its load fails (with runtime.gpu_fallback), or when
    the API process restarts this worker on CPU after repeated deaths on the GPU."""
    plan = choose_backend(
        context.n_gpu_layers,
        gpu_support,
        fallback=config.gpu_fallback,
        fault=config.fault_gpu_init,
        forced_cpu_reason=config.cpu_fallback_reason,
    )
    if plan.crash:
        _crash_for_fault(config)
    log_plan(plan, config.worker_id)

    def load(n_gpu_layers: int) -> LlamaCppBackend:
        return LlamaCppBackend(dataclasses.replace(context, n_gpu_layers=n_gpu_layers))

    backend, plan = load_with_fallback(plan, load, fallback=config.gpu_fallback)
    backend.offload = plan
    return backend


def _crash_for_fault(config: WorkerConfig) -> None:
    """Fault injection (`runtime.fault_gpu_init: crash`): die at start with SIGSEGV as
    the CUDA start-up crash did. On a thread of the API process (in_process) a crash
    would take the server down: the load fails instead."""
    logger.error("worker %d: fault injected: crashing at start (GPU layers)", config.worker_id)
    if not config.exit_with_parent:
        raise ModelLoadError("fault injected: the GPU worker crashed at start")
    os.kill(os.getpid(), signal.SIGSEGV)


def _speculator(config: WorkerConfig, backend: LlamaCppBackend) -> NgramProposer | None:
    """The draft proposer of `config.speculative` (None = off): n-gram, or a draft model
    in a context of its own, one sequence per running slot."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.cost is None:  # measured for this model on this machine (spec_cost.py)
        measured = calibrated_step_cost(
            backend,
            config.context.n_seq_max - 1,
            lambda: backend.make_sampler(sampler_spec(SamplingParams(max_tokens=1))),
            Path(spec.cost_record).expanduser() if spec.cost_record else None,
            record_key(config.context),
        )
        spec = dataclasses.replace(spec, cost=measured)
    if spec.draft_model is None:
        return NgramProposer(spec)
    context = dataclasses.replace(
        config.context,
        model_path=spec.draft_model,
        n_seq_max=config.max_num_seqs,
        kv_unified=False,
        lora=(),
        n_gpu_layers=backend.config.n_gpu_layers,  # where the target model went (fallback)
    )
    draft = LlamaCppBackend(context)
    try:
        check_same_vocab(backend, draft, (backend.n_vocab, draft.n_vocab))
    except ModelLoadError:
        draft.close()
        backend.close()
        raise
    return DraftModelProposer(spec, draft=draft, batch_tokens=config.max_batch_tokens)


def _offload_of(core: EngineCore) -> OffloadPlan:
    """Where `core`'s model runs (CPU for a backend that is not llama.cpp's)."""
    backend = core.backend
    if isinstance(backend, LlamaCppBackend) and backend.offload is not None:
        return backend.offload
    return OffloadPlan(requested="cpu", backend="cpu", n_gpu_layers=0)


def embedder_factory(core: EngineCore, config: WorkerConfig) -> Callable[[], EmbeddingBackend]:
    """Builds, when called, the embedding context over the model `core` already holds."""

    def make() -> EmbeddingBackend:
        backend = core.backend
        if not isinstance(backend, LlamaCppBackend):
            raise EngineError("embeddings need the llama.cpp backend")
        sizes = EmbedContextConfig.for_worker(config.context, config.max_batch_tokens)
        return LlamaCppEmbedder(backend.model_handle, sizes)

    return make


def worker_process_main(config: WorkerConfig) -> None:
    """Entry point of a spawned worker process."""
    # NOTE: Ctrl-C reaches the whole process group; the API process coordinates
    # shutdown, so the worker ignores SIGINT instead of dying mid-step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(config.observability, file_suffix=f".worker-{config.worker_id}")
    if config.cpus:
        try:
            os.sched_setaffinity(0, config.cpus)
        except OSError as exc:  # a CPU id the machine lacks: run unpinned, say so
            logger.warning(
                "worker %d: cannot pin to CPUs %s: %s", config.worker_id, config.cpus, exc
            )
    run_worker(config)


def run_worker(config: WorkerConfig) -> None:
    """Load the engine, report ready (or failed), then serve until Shutdown.

    Uses a ZeroMQ context of its own (ipc:// works across contexts), so the same code
    serves a spawned process and a thread of the API process.
    """
    zmq_context = zmq.Context()
    try:
        _serve(config, zmq_context)
    finally:
        zmq_context.term()


class _ApiGone(Exception):
    """The API process stopped reading worker output: it died, or stalled for too long."""


class _Outbox:
    """The worker's output: one frame per message over the Unix socket the API listens
    on (frames.py).

    NOTE: a writer whose reader stalls would block forever and leave an orphaned worker
    holding the model and KV cache. `FrameWriter` waits in one-second polls, asks
    `orphaned()` at each, and gives up once the API process is gone or has not read
    anything for `_SEND_GIVE_UP_S`. Every send also checks the parent first, so a worker
    whose API died exits at its next step instead of generating for nobody.
    """

    def __init__(self, path: str, exit_with_parent: bool) -> None:
        self.exit_with_parent = exit_with_parent
        self.parent_pid = os.getppid()
        try:
            self.writer = FrameWriter(path, self.orphaned, give_up_s=_SEND_GIVE_UP_S)
        except OSError as exc:
            raise _ApiGone(f"cannot reach the API process at {path}: {exc}") from None

    def orphaned(self) -> bool:
        return self.exit_with_parent and os.getppid() != self.parent_pid

    def send(self, message: EngineOutput) -> None:
        if self.orphaned():  # one getppid() syscall
            raise _ApiGone("the API process is gone")
        try:
            self.writer.send(encode(message))
        except ChannelClosed as exc:
            raise _ApiGone(str(exc)) from None

    def close(self) -> None:
        self.writer.close()


def _serve(config: WorkerConfig, zmq_context: zmq.Context[zmq.Socket[bytes]]) -> None:
    inputs = zmq_context.socket(zmq.PULL)
    inputs.setsockopt(zmq.LINGER, 0)
    inputs.connect(config.input_address)
    try:
        outbox = _Outbox(config.output_address, config.exit_with_parent)
        try:
            _load_and_serve(config, inputs, outbox, zmq_context)
        finally:
            outbox.close()
    except _ApiGone as exc:
        logger.warning("worker %d exits: %s", config.worker_id, exc)
    finally:
        inputs.close()


def _heartbeat(
    config: WorkerConfig, context: zmq.Context[zmq.Socket[bytes]], outbox: _Outbox
) -> tuple[Heartbeat | None, StepClock]:
    clock = StepClock()
    if not config.health_address:
        return None, clock
    heartbeat = Heartbeat(
        context,
        worker_id=config.worker_id,
        generation=config.generation,
        address=config.health_address,
        output_path=config.output_address,
        orphaned=outbox.orphaned,
        clock=clock,
    )
    return heartbeat, clock


def _load_and_serve(
    config: WorkerConfig,
    inputs: zmq.Socket[bytes],
    outbox: _Outbox,
    zmq_context: zmq.Context[zmq.Socket[bytes]],
) -> None:
    started_at = time.monotonic()
    try:
        core = build_engine_core(config)
    except InferfluxError as exc:
        logger.error("worker %d failed to start: %s", config.worker_id, exc.message)
        failed = WorkerFailed(
            worker_id=config.worker_id, generation=config.generation, message=exc.message
        )
        outbox.send(failed)
        return
    plan = _offload_of(core)
    ready = WorkerReady(
        worker_id=config.worker_id,
        generation=config.generation,
        pid=os.getpid(),
        load_s=time.monotonic() - started_at,
        backend=plan.backend,
        requested_backend=plan.requested,
        fallback_reason=plan.fallback_reason,
    )
    embeds = EmbedQueue(embedder_factory(core, config))
    provider = make_tracer_provider(
        config.observability.tracing, component=f"worker-{config.worker_id}"
    )
    tracer = get_tracer(provider)
    spans = EngineSpans(tracer, config.worker_id) if tracer is not None else None
    heartbeat, clock = _heartbeat(config, zmq_context, outbox)
    try:
        if heartbeat is not None:
            heartbeat.start()  # before WorkerReady: the API pings once it is ready
        outbox.send(ready)
        logger.info("worker %d ready in %.2fs", config.worker_id, ready.load_s)
        _WorkerLoop(core, inputs, outbox, config, embeds, spans, clock).run()
    finally:
        if heartbeat is not None:
            heartbeat.stop()  # NOTE: its socket closes before the ZeroMQ context ends
        embeds.close()  # NOTE: before core.close(), which frees the model it uses
        core.close()
        if provider is not None:
            provider.shutdown()  # flushes the spans still batched


class _WorkerLoop:
    def __init__(
        self,
        core: EngineCore,
        inputs: zmq.Socket[bytes],
        outbox: _Outbox,
        config: WorkerConfig,
        embeds: EmbedQueue,
        spans: EngineSpans | None = None,
        clock: StepClock | None = None,
    ) -> None:
        self.core = core
        self.clock = clock if clock is not None else StepClock()  # read by the heartbeat
        self.inputs = inputs
        self.outbox = outbox
        self.config = config
        self.embeds = embeds
        self.spans = spans  # None when tracing is off
        self.stream = StreamBuffer(config.scheduling.stream_interval)
        self._generated_at = -math.inf  # time.monotonic() of the last engine step
        self.poller = zmq.Poller()
        self.poller.register(inputs, zmq.POLLIN)
        # messages read during a step (`_high_arrived`), applied before any newer one
        self._early: deque[EngineInput] = deque()
        core.high_arrived = self._high_arrived

    def run(self) -> None:
        while True:
            timeout = _IDLE_POLL_MS
            if self.embeds.has_work():
                timeout = 0
            elif self.core.has_work():
                timeout = math.ceil(self.core.wait_s() * 1000)
            deltas: list[RequestDelta] = []
            ready = bool(self._early) or bool(self.poller.poll(timeout))
            if ready and self._drain_inputs(deltas):
                self._send(deltas)
                return
            step_s = 0.0
            if self.core.has_work():
                started = time.monotonic()
                self.clock.begin()
                deltas.extend(self.core.step())
                self.clock.end()
                self._generated_at = time.monotonic()
                step_s = self._generated_at - started
            self._send(deltas)
            if self.core.kv_offload is not None:
                self.core.kv_offload.tick(self.core.scheduler.prefix_cache)
            if self.embeds.has_work():
                self.clock.begin()
                self._embed_pass(step_s)
                self.clock.end()
            elif not deltas and not self.core.has_work() and self.outbox.orphaned():
                logger.warning("worker %d: API process is gone; exiting", self.config.worker_id)
                return

    def _embed_pass(self, step_s: float) -> None:
        """One bounded embedding pass between engine steps (embed_queue.py). While
        generations run it takes at most as long as the step before it and at most
        `scheduler.embed_tokens_per_step` tokens, so a large embeddings request costs each
        stream about one step more per token, not a whole batch. Within
        `_INTERACTIVE_WINDOW_S` of the last generation step a pass alone lasts at most
        about `_IDLE_EMBED_PASS_S`, so the next chat waits little for it to end; with no
        generation for longer, passes are whole batches (the fastest per token: measured
        322 tok/s at 512 tokens against 254 at 64, SmolLM2 on 2 cores)."""
        if self.core.has_work():
            max_tokens = self.config.scheduling.embed_tokens_per_step
            max_s = max(step_s, _MIN_EMBED_PASS_S)
            outcomes = self.embeds.step(max_tokens=max_tokens, max_seconds=max_s)
        elif time.monotonic() - self._generated_at < _INTERACTIVE_WINDOW_S:
            outcomes = self.embeds.step(max_seconds=_IDLE_EMBED_PASS_S)
        else:
            outcomes = self.embeds.step()
        self._send_embeddings(outcomes)

    def _high_arrived(self) -> bool:
        """Asked during a step that may be interrupted (EngineCore): read what arrived
        meanwhile (kept, in order, for `_drain_inputs`); True when it holds a new
        high-priority request. Runs on this thread: llama.cpp calls its abort callback on
        the thread that called llama_decode."""
        high = False
        while (message := self._read_socket()) is not None:
            self._early.append(message)
            high = high or (isinstance(message, AddRequest) and message.priority == Priority.HIGH)
        return high

    def _read_socket(self) -> EngineInput | None:
        try:
            return decode_input(self.inputs.recv(zmq.NOBLOCK))
        except zmq.Again:
            return None

    def _next_input(self) -> EngineInput | None:
        return self._early.popleft() if self._early else self._read_socket()

    def _drain_inputs(self, deltas: list[RequestDelta]) -> bool:
        """Apply every queued message. Returns True on Shutdown (after aborting all)."""
        while True:
            message = self._next_input()
            if message is None:
                return False
            if isinstance(message, AddRequest):
                rejected = self.core.add_request(message)
                deltas.extend(rejected)
                if message.hold_s > 0 and not rejected:
                    self.stream.hold(message.request_id, message.hold_s)
                if self.spans is not None and not rejected:
                    self.spans.on_added(message.request_id, message.trace_context)
            elif isinstance(message, AbortRequests):
                deltas.extend(self.core.abort_requests(message.request_ids))
                self.embeds.abort(message.request_ids)
            elif isinstance(message, EmbedRequest):
                self._send_embeddings(self.embeds.add(message))
            elif isinstance(message, Reconfigure):
                self._reconfigure(message)
            elif isinstance(message, Shutdown):
                deltas.extend(self.core.abort_requests(self.core.request_ids()))
                return True

    def _reconfigure(self, message: Reconfigure) -> None:
        """Live tuning: the scheduler's knobs, the step budget (never above the context's
        batch), the stream interval, the embedding share and the log policy."""
        scheduling = SchedulerSettings.model_validate(message.scheduler)
        budget = min(scheduling.max_batch_tokens, self.config.context.n_batch)
        self.config = dataclasses.replace(
            self.config, scheduling=scheduling, max_batch_tokens=budget
        )
        self.core.scheduler.policy = scheduling_policy(scheduling)
        self.core.scheduler.max_batch_tokens = budget
        self.stream.interval = scheduling.stream_interval
        update_log_policy(ObservabilitySettings.model_validate(message.observability))
        logger.info("worker %d: settings changed at runtime", self.config.worker_id)

    def _send(self, deltas: list[RequestDelta]) -> None:
        """One StepOutputs with these deltas and the step stats since the last one; nothing
        when there is neither (an idle loop turn)."""
        produced = bool(deltas)
        deltas = self.stream.take(deltas)
        if produced and not deltas:
            return  # all held back (stream_interval): the stats go with the next message
        step = self.core.take_step_stats()
        if not deltas and step is None:
            return
        handoffs = self.core.handoffs
        if handoffs is not None:  # taken whether traced or not: the list stays short
            transfers = handoffs.end.recorder.take_transfers()
            if transfers and self.spans is not None:
                self.spans.on_transfers(transfers)
        if step is not None and self.spans is not None:
            self.spans.on_finished(step.finished)
        message = StepOutputs(
            worker_id=self.config.worker_id,
            generation=self.config.generation,
            deltas=deltas,
            stats=self.core.stats(),
            step=step,
        )
        self.outbox.send(message)

    def _send_embeddings(self, outcomes: list[EmbedOutcome]) -> None:
        for outcome in outcomes:
            vectors = outcome.vectors
            self.outbox.send(
                EmbedResult(
                    worker_id=self.config.worker_id,
                    generation=self.config.generation,
                    request_id=outcome.request_id,
                    embeddings=b"" if vectors is None else vectors.astype("<f4").tobytes(),
                    n_embd=0 if vectors is None else int(vectors.shape[1]),
                    num_tokens=outcome.num_tokens,
                    error=outcome.error,
                )
            )
