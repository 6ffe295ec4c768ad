"""Building a worker's engine from its picklable `WorkerConfig`.

Owns: `WorkerConfig` (everything a worker needs, pickled into spawned processes) and
`worker_config(settings, model_info)`, which makes one from the settings; what a config
turns into inside the worker: the backend (CPU or GPU, with fallback; LoRA adapters;
files verified first), the scheduler and its policy, the prefix cache and its host and
disk tiers, speculative decoding (n-gram or a draft model, its step costs calibrated),
the image preparer, and the embedding context. Does not own: the worker loop
(worker.py) or any engine logic (core.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
from inferflux.engine.embed_queue import EmbeddingBackend
from inferflux.engine.image_prep import ImagePreparer, ImageRows
from inferflux.engine.kv_channel import KvChannelEnd, ticket_model_id
from inferflux.engine.kv_setup import build_kv_offload, model_identity, tiers_enabled
from inferflux.engine.messages import (
    SamplingParams,
)
from inferflux.engine.model_verify import verified_file, verify_mmproj
from inferflux.engine.protocol import LoraAdapter, ModelInfo
from inferflux.engine.spec_cost import calibrated_step_cost, record_key
from inferflux.engine.spec_draft import DraftModelProposer, check_same_vocab
from inferflux.engine.speculative import NgramProposer, SpecConfig, StepCost
from inferflux.errors import EngineError, ModelLoadError
from inferflux.scheduler import Scheduler
from inferflux.scheduler.policy import SchedulingPolicy
from inferflux.scheduler.prefix_cache import PrefixCache
from inferflux.scheduler.request import PriorityClass

logger = logging.getLogger(__name__)


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


def offload_of(core: EngineCore) -> OffloadPlan:
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
