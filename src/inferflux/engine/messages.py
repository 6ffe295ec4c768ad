"""Every message that crosses the API ⇄ worker boundary, as msgspec Structs.

This module owns the wire contract only: no logic, no I/O. Messages are encoded with
msgpack (`encode`/`decode_input`/`decode_output`). A worker sends one `StepOutputs` per
engine step carrying the deltas of all its requests, never one message per token.

API → worker: `AddRequest`, `AbortRequests`, `Shutdown`, `EmbedRequest`, `Reconfigure`;
`Ping` on the worker's health socket.
Worker → API: `WorkerReady`, `WorkerFailed`, `StepOutputs`, `EmbedResult`, `Pong`.
"""

from __future__ import annotations

import enum
from typing import Any, cast

import msgspec


class FinishReason(enum.StrEnum):
    """Why a request ended. Ordering carries no meaning; the OpenAI mapping is in
    `OPENAI_FINISH_REASON` (the one table API code uses)."""

    STOP = "stop"  # an end-of-generation token
    STOP_SEQUENCE = "stop_sequence"  # a stop string matched (its text is never streamed)
    LENGTH = "length"  # max_tokens, or the context is full
    ABORT = "abort"  # cancelled: client gone, or shutdown
    ERROR = "error"  # failed inside the engine; `RequestDelta.error` says why
    TIMEOUT = "timeout"  # waited in the queue past `scheduler.queue_timeout_s`; never ran
    # a guardrail stopped the output (set by the API's engine wrapper, never by a worker)
    CONTENT_FILTER = "content_filter"
    # disaggregated mode: a prefill worker computed the prompt and wrote its KV ticket
    # (`RequestDelta.ticket`); the API hands the request to a decode worker and never
    # shows this reason to a client
    HANDOFF = "handoff"


class Priority(enum.StrEnum):
    """Scheduling class of a request (every API accepts `priority`; default normal)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


OPENAI_FINISH_REASON: dict[FinishReason, str] = {
    FinishReason.STOP: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "stop",
    FinishReason.ERROR: "error",
    FinishReason.TIMEOUT: "error",
    FinishReason.CONTENT_FILTER: "content_filter",
    FinishReason.HANDOFF: "error",  # never reaches a client (engine/client.py hands it on)
}


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How one request samples. Validated at the API edge; the engine trusts it."""

    max_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    seed: int | None = None  # None = a fresh random seed per request
    repeat_penalty: float = 1.0  # 1 = off (llama.cpp semantics)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # recent generated tokens penalties look at; -1 = the context
    # llama.cpp's other samplers (api/generation/sampler_options.py documents them)
    typical_p: float = 1.0  # 1 = off
    top_n_sigma: float = -1.0  # <= 0 = off
    mirostat: int = 0  # 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (replaces the other samplers)
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dynatemp_range: float = 0.0  # 0 = off: temperature ± range, by the distribution's entropy
    dynatemp_exponent: float = 1.0
    dry_multiplier: float = 0.0  # 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # -1 = the context, 0 = off
    dry_sequence_breakers: list[str] = msgspec.field(default_factory=lambda: ["\n", ":", '"', "*"])
    xtc_probability: float = 0.0  # 0 = off
    xtc_threshold: float = 0.1
    samplers: list[str] | None = None  # the order of the samplers (None: llama.cpp's)
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)
    stop: list[str] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    # None = off; k >= 0 = each sampled token's logprob plus the k most likely tokens
    logprobs: int | None = None
    # None = off; k >= 0 = the logprob of every prompt token after the first, plus top k
    prompt_logprobs: int | None = None
    # An llguidance grammar (engine/grammar.py compiles JSON schemas, GBNF, Lark and
    # regexes into one), enforced token by token; None = unconstrained. The request
    # finishes (STOP) as soon as the grammar is complete.
    constraint: str | None = None
    # False: never speculate for this request (runtime.speculative_decoding does otherwise)
    speculative: bool = True


class ImageInput(msgspec.Struct, kw_only=True, frozen=True):
    """One image of a prompt (issue 28): the encoded file as the client sent it, already
    sniffed (PNG, JPEG, WebP, GIF) and size-checked by the API. The worker decodes it,
    encodes it with the model's mmproj and feeds its embeddings where it stands."""

    sha256: str  # hex SHA-256 of `data`: the image's id in logs, audit and cache keys
    data: bytes
    # index into `AddRequest.prompt_token_ids` that the image's tokens go before
    # (len(prompt_token_ids): after the last token)
    position: int


class KvTicket(msgspec.Struct, kw_only=True):
    """A prefill → decode hand-off (engine/kv_channel.py): the KV of a request's first
    `n_tokens` prompt tokens (all but the last) in a shared-memory file at `path`."""

    path: str  # named by the API process, which owns its lifetime (and unlinks it)
    n_tokens: int = 0  # prompt positions the KV covers: len(prompt) - 1
    nbytes: int = 0  # size of the ticket file (header + llama.cpp sequence state)
    enqueued_at: float = 0.0  # time.monotonic() when the prefill worker finished writing
    enqueued_ns: int = 0  # time.time_ns() of the same moment (the trace span's start)
    write_s: float = 0.0  # serializing the sequence into the file (prefill side)
    num_cached_tokens: int = 0  # prompt tokens the prefill worker took from its prefix cache


class AddRequest(msgspec.Struct, tag="add", kw_only=True):
    """Start generating for a tokenized prompt."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: Priority = Priority.NORMAL
    # Prefix-cache namespace (tenant / adapter): KV is reused only within one namespace.
    cache_namespace: str = ""
    # W3C trace context (`traceparent`, `tracestate`) of the API-side span, so the worker's
    # queue / prefill / decode spans join the request's trace. None when tracing is off.
    trace_context: dict[str, str] | None = None
    # images of the prompt, by position (ascending); only for a model with an mmproj
    images: list[ImageInput] = msgspec.field(default_factory=list)
    # disaggregated mode, prefill worker: compute all prompt tokens but the last, write
    # their KV to this ticket path and finish with HANDOFF ("" = an ordinary request)
    ticket_path: str = ""
    # disaggregated mode, decode worker: hydrate the prompt's KV from this ticket, then
    # decode (a refused ticket is logged and the prompt computed here instead)
    kv_ticket: KvTicket | None = None
    # time.time() when the API process handed it to the worker's socket (0: unknown). The
    # worker counts its queue wait from here, so the wait for the step in flight when it
    # arrived (the worker reads its socket between steps) is queue wait too.
    sent_at: float = 0.0
    # > 0: nobody streams this request (its client reads the whole answer at the end): the
    # worker may merge its tokens and send them every hold_s seconds (stream_buffer.py)
    hold_s: float = 0.0


class AbortRequests(msgspec.Struct, tag="abort"):
    """Stop these requests at the next step and free their KV. Unknown ids are ignored."""

    request_ids: list[str]


class Shutdown(msgspec.Struct, tag="shutdown"):
    """Abort everything and exit the worker loop."""


class Reconfigure(msgspec.Struct, tag="reconfigure", kw_only=True):
    """Live tuning (PATCH /v1/admin/config): the `scheduler` and `observability` settings
    sections as JSON, validated again by the worker with the config schema."""

    scheduler: dict[str, Any]
    observability: dict[str, Any]


class EmbedRequest(msgspec.Struct, tag="embed", kw_only=True):
    """Embed each token list (one pooled vector per input). `AbortRequests` with this
    `request_id` drops it; the answer is one `EmbedResult`."""

    request_id: str
    inputs: list[list[int]]
    normalize: bool = True  # L2-normalize each vector


class Ping(msgspec.Struct, tag="ping"):
    """Health check, sent on the worker's health socket: its heartbeat thread answers
    `Pong(seq)` at once, even during a long step (engine/heartbeat.py). A worker that
    answers nothing is frozen (engine/worker_health.py)."""

    seq: int


EngineInput = AddRequest | AbortRequests | Shutdown | EmbedRequest | Reconfigure | Ping


class TokenLogprob(msgspec.Struct, array_like=True):
    """One position's log-probability (natural log, of the model's raw distribution,
    before temperature and penalties), and the `top` most likely (token id, logprob)
    pairs at that position, most likely first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = msgspec.field(default_factory=list)


class RequestDelta(msgspec.Struct, kw_only=True):
    """What one request produced in one step.

    `text` is safe to show: UTF-8 complete, and with any text that might still turn into
    a stop string held back. `finish_reason` is set on the request's last delta only.
    """

    request_id: str
    text: str = ""
    token_ids: list[int] = msgspec.field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    error: str | None = None
    # with `error`: the InferfluxError code when the failure is the request's own fault
    # (`constraint_failed`: its grammar exceeded the engine's limits); None otherwise
    error_code: str | None = None
    # with finish_reason STOP_SEQUENCE: the stop string that matched (never streamed)
    stop_sequence: str | None = None
    # aligned with token_ids when SamplingParams.logprobs is set
    logprobs: list[TokenLogprob] | None = None
    # on the first delta only, when SamplingParams.prompt_logprobs is set: one entry per
    # prompt token, None for the first (nothing predicts it)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # speculative decoding so far (llama-server's draft_n / draft_n_accepted)
    num_draft_tokens: int = 0
    num_draft_accepted: int = 0
    # with finish_reason HANDOFF: the ticket the prefill worker wrote
    ticket: KvTicket | None = None


class FairnessStats(msgspec.Struct, kw_only=True):
    """Scheduler fairness counters since the worker started (OBS-1 names in /metrics)."""

    preemptions: int = 0
    yields: int = 0
    resumes: int = 0
    timeouts: int = 0  # queue timeouts (408)
    tokens: dict[str, int] = msgspec.field(default_factory=dict)  # generated, per priority
    # steps stopped part-way for a high-priority arrival (scheduler.fairness.interrupt_steps)
    interrupts: int = 0


class PrefixCacheStats(msgspec.Struct, kw_only=True):
    """Prefix cache counters since the worker started, and its size now."""

    hits: int = 0
    misses: int = 0
    partial_hits: int = 0
    matched_tokens: int = 0
    evictions: int = 0
    inserts: int = 0
    entries: int = 0
    cached_tokens: int = 0
    max_tokens: int = 0
    parked: int = 0  # finished requests' KV kept in their slots (scheduler/parking.py)
    parked_tokens: int = 0


class KvTierStats(msgspec.Struct, kw_only=True):
    """Counters since start, and the tiers' sizes now (EngineStats.kv_tiers)."""

    host_bytes: int = 0
    host_entries: int = 0
    host_max_bytes: int = 0
    disk_bytes: int = 0
    disk_entries: int = 0
    disk_max_bytes: int = 0
    host_hits: int = 0
    disk_hits: int = 0
    spills: int = 0  # entries serialized out of llama.cpp into the host tier
    restores: int = 0  # hits loaded back into a sequence
    restored_tokens: int = 0
    refusals: int = 0  # blobs refused on load (corrupt, other model or layout, llama.cpp)
    skipped: int = 0  # hits not restored: recomputing was estimated cheaper
    host_evictions: int = 0  # host → disk (or dropped without a disk tier)
    disk_evictions: int = 0
    dropped_writes: int = 0  # disk writes refused by a full queue
    write_errors: int = 0  # disk writes that failed (disk full, read-only): entry dropped
    quota_evictions: int = 0


class SpeculativeStats(msgspec.Struct, kw_only=True):
    """Speculative decoding counters since the worker started (engine/speculative.py)."""

    chunks: int = 0  # drafts verified
    chunks_accepted: int = 0  # drafts accepted whole
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafted tokens accepted: "tokens reused"
    # what the goodput gate learned (n-gram mode): per bucket of match lengths, from the
    # shortest (engine/speculative.py MATCH_BUCKETS), the acceptance and positions seen
    match_rates: list[float] = msgspec.field(default_factory=list)
    match_seen: list[int] = msgspec.field(default_factory=list)


class ImageStats(msgspec.Struct, kw_only=True):
    """Images of a worker whose model has an mmproj (engine/image_prep.py)."""

    num_images_total: int = 0  # images of the requests prepared (an image reused counts)
    encode_seconds_total: float = 0.0  # decoding files + running the vision tower (not reused)
    num_preparing: int = 0  # requests whose images are being encoded now
    rows_bytes: int = 0  # embedding rows kept (pinned by live requests, or reusable)


class TicketStats(msgspec.Struct, kw_only=True):
    """KV tickets of a worker in disaggregated mode, since it started (kv_channel.py)."""

    written: int = 0  # prefill side: tickets written
    write_seconds_total: float = 0.0
    written_bytes: int = 0
    hydrated: int = 0  # decode side: tickets loaded into a sequence
    hydrate_seconds_total: float = 0.0  # reading and loading them (llama.cpp set_data)
    refused: int = 0  # tickets refused (gone, other model or layout, llama.cpp): recomputed


class EngineStats(msgspec.Struct, kw_only=True):
    """A worker's state after its latest step (or when idle)."""

    num_running: int = 0
    num_waiting: int = 0
    num_steps: int = 0
    num_prompt_tokens_total: int = 0
    num_generated_tokens_total: int = 0
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    decode_failures: int = 0  # failed llama_decode calls (each retried smaller: REQ-9.3)
    memory_pressure: bool = False  # host memory below scheduler.memory_low_mb (REQ-9.5)
    memory_pressure_episodes: int = 0
    host_memory_available_bytes: int = -1  # -1 = unknown
    waiting_by_priority: dict[str, int] = msgspec.field(default_factory=dict)
    fairness: FairnessStats = msgspec.field(default_factory=FairnessStats)
    prefix_cache: PrefixCacheStats | None = None  # None when the prefix cache is off
    kv_tiers: KvTierStats | None = None  # None without host/disk tiers (kv_offload.py)
    speculative: SpeculativeStats | None = None  # None when speculative decoding is off
    images: ImageStats | None = None  # None for a text-only model
    role: str = "unified"  # "prefill" | "decode" in disaggregated mode (scheduler.mode)
    tickets: TicketStats | None = None  # None in unified mode


class Admission(msgspec.Struct, array_like=True):
    """A request scheduled for the first time: how long it waited in the worker's queue."""

    request_id: str
    priority: str
    queue_wait_s: float


class RequestPhases(msgspec.Struct, array_like=True):
    """When a finished request went through each engine phase (worker `time.monotonic()`
    stamps). `scheduled_at` is None when it never ran (aborted or timed out while
    queued); `first_token_at` is None when it produced no token."""

    request_id: str
    priority: str
    added_at: float
    scheduled_at: float | None
    first_token_at: float | None
    finished_at: float
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    finish_reason: str


class StepStats(msgspec.Struct, kw_only=True):
    """What the engine did since the worker's previous message: one entry per engine step
    in the `step_*` lists (usually one), the requests admitted, and those that finished.
    The API side turns these into histograms (observability/metrics.py)."""

    step_exec_s: list[float] = msgspec.field(default_factory=list)  # schedule → decode → sample
    step_num_seqs: list[int] = msgspec.field(default_factory=list)  # sequences in the batch
    step_num_tokens: list[int] = msgspec.field(default_factory=list)  # tokens in the batch
    num_prompt_tokens: int = 0  # prompt tokens computed (prefilled)
    num_generated_tokens: int = 0
    admitted: list[Admission] = msgspec.field(default_factory=list)
    finished: list[RequestPhases] = msgspec.field(default_factory=list)
    # decode worker: seconds from each ticket's enqueue (prefill wrote it) to hydrated
    transfer_s: list[float] = msgspec.field(default_factory=list)


class WorkerReady(msgspec.Struct, tag="ready", kw_only=True):
    """The worker loaded its model and takes requests."""

    worker_id: int
    generation: int
    pid: int
    load_s: float
    backend: str = "cpu"  # where the model runs ("cpu", "cuda", ...)
    requested_backend: str = "cpu"  # what runtime.n_gpu_layers asked for
    fallback_reason: str | None = None  # why backend != requested_backend (GPU → CPU)


class WorkerFailed(msgspec.Struct, tag="failed", kw_only=True):
    """The worker could not start (the model failed to load); it exits after sending."""

    worker_id: int
    generation: int
    message: str


class StepOutputs(msgspec.Struct, tag="step", kw_only=True):
    """All deltas of one engine step of one worker, plus its stats."""

    worker_id: int
    generation: int
    deltas: list[RequestDelta]
    stats: EngineStats
    step: StepStats | None = None  # None when nothing ran since the previous message


class EmbedResult(msgspec.Struct, tag="embedded", kw_only=True):
    """The vectors of one `EmbedRequest`, or why it failed (`error` set, `embeddings` empty).

    `embeddings` is little-endian float32, row-major: len(inputs) rows of `n_embd` floats
    (measured for 64 × 576: 147 KB and 0.36 ms encode → decode → lists, against 332 KB and
    1.7 ms as msgpack float lists).
    """

    worker_id: int
    generation: int
    request_id: str
    embeddings: bytes = b""
    n_embd: int = 0
    num_tokens: int = 0  # prompt tokens embedded, over all inputs
    error: str | None = None


class Pong(msgspec.Struct, tag="pong", kw_only=True):
    """The answer to `Ping(seq)`: the worker process runs; `busy_s` is how long its
    current engine step (or embedding pass) has run, 0.0 between steps."""

    worker_id: int
    generation: int
    seq: int
    busy_s: float = 0.0


EngineOutput = WorkerReady | WorkerFailed | StepOutputs | EmbedResult | Pong

_encoder = msgspec.msgpack.Encoder()
_input_decoder = msgspec.msgpack.Decoder(EngineInput)
_output_decoder = msgspec.msgpack.Decoder(EngineOutput)


def encode(message: EngineInput | EngineOutput) -> bytes:
    """Serialize any message of this module."""
    return _encoder.encode(message)


def decode_input(data: bytes) -> EngineInput:
    """Parse a message sent to a worker."""
    return cast(EngineInput, _input_decoder.decode(data))


def decode_output(data: bytes) -> EngineOutput:
    """Parse a message sent by a worker."""
    return cast(EngineOutput, _output_decoder.decode(data))
