"""llama.cpp through llama-cpp-python's low-level API (with the `llama_cpp_*` modules beside it).

Owns: loading a GGUF (full, or vocab-only for the API process's tokenizer), one
`llama_context` with many sequences, the step's `llama_batch`, `llama_decode`, per-sequence
sampler chains, and KV cleanup per sequence. Does not own: which tokens go into a step
(the scheduler decides) or what a sampled token means (EngineCore decides).

Thread rule: a `LlamaCppBackend` (its context) is touched by one thread only. A
`LlamaTokenizer` only reads the vocabulary and is safe from any thread.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import mmap
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

# NOTE: llama_cpp (which loads libllama) before numpy and pyzmq: with one CUDA build a
# process that loaded either of them first segfaulted in llama_model_load_from_file
# (BENCHMARKS.md, GPU). engine/__init__.py imports this module first for that reason.
import llama_cpp as ll  # isort: split

import numpy as np

from inferflux.engine.backends.base import (
    DecodeChunk,
    Logprob,
    SamplerHandle,
    SamplerSpec,
    StepInterrupted,
)
from inferflux.engine.backends.buffers import in_place
from inferflux.engine.backends.llama_cpp_sampler import LogitMasker, Sampler
from inferflux.engine.backends.llama_cpp_vocab import BackgroundGrammarTokenizer, token_piece
from inferflux.engine.backends.offload import GpuSupport, OffloadPlan
from inferflux.engine.grammar import GrammarLimits, MatcherFactory, validate_grammar
from inferflux.errors import EngineError, KvCacheFull, ModelLoadError

logger = logging.getLogger(__name__)

# what sequence state is written into or read from in place (a shared-memory map)
WritableBuffer = mmap.mmap | bytearray

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation. Info is chatty: debug.
_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}


# What llama.cpp logs for every interrupted decode (ggml status 1 is "aborted", which only
# `set_interrupt` causes) and the KV rollback of any stopped one: the engine counts and
# reports these itself (inferflux_fairness_interrupts), so they are debug lines here.
_STOPPED_STEP_LINES = (
    b"removing memory module entries",
    b"compute_async failed with error 1",
    b"compute graph, compute status: 1",
)


def _log_to_python(level: int, text: bytes | None, _user_data: Any) -> None:  # Any: void*
    """Route llama.cpp's log lines into Python logging (debug unless a warning/error)."""
    if text:
        log_level = _LOG_LEVELS.get(level, logging.DEBUG)
        if any(line in text for line in _STOPPED_STEP_LINES):
            log_level = logging.DEBUG
        logger.log(log_level, "%s", text.decode("utf-8", "replace").rstrip())


# Kept referenced for the process lifetime: llama.cpp holds the pointer.
_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(
    _log_to_python
)


@functools.cache
def _ensure_backend() -> None:
    """Initialise llama.cpp once per process (functools.cache makes it idempotent)."""
    ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
    ll.llama_backend_init()


# ggml_backend_dev_type: 0 CPU, 1 GPU, 2 integrated GPU, 3 accelerator (BLAS, AMX), 4 meta
_GPU_DEVICE_TYPES = (1, 2)


def _ggml_function(name: str, restype: Any, argtypes: list[Any]) -> Any:  # Any: ctypes
    """A ggml function through libllama's handle (dlsym searches its dependencies)."""
    function = getattr(ll.llama_cpp._lib, name)
    function.restype, function.argtypes = restype, argtypes
    return function


def gpu_support() -> GpuSupport:
    """What this llama.cpp build and host offer for offloading (the offload seam's probe):
    `llama_supports_gpu_offload`, and the GPU devices ggml registered, named by their
    backend ("cuda", "metal", "vulkan"). A build whose ggml device API cannot be reached
    is taken at its word: one unnamed device when it can offload."""
    _ensure_backend()
    can_offload = bool(ll.llama_supports_gpu_offload())
    try:
        names = _gpu_device_backends()
    except AttributeError:  # NOTE: the symbols are missing from this build's libraries
        return GpuSupport(can_offload=can_offload, num_devices=1 if can_offload else 0)
    return GpuSupport(
        can_offload=can_offload,
        backend=names[0].lower() if names else "",
        num_devices=len(names),
    )


def _gpu_device_backends() -> list[str]:
    """The backend name of every GPU device ggml registered, in device order."""
    vp = ctypes.c_void_p
    count = _ggml_function("ggml_backend_dev_count", ctypes.c_size_t, [])
    get = _ggml_function("ggml_backend_dev_get", vp, [ctypes.c_size_t])
    dev_type = _ggml_function("ggml_backend_dev_type", ctypes.c_int, [vp])
    dev_reg = _ggml_function("ggml_backend_dev_backend_reg", vp, [vp])
    reg_name = _ggml_function("ggml_backend_reg_name", ctypes.c_char_p, [vp])
    names: list[str] = []
    for index in range(count()):
        device = get(index)
        if dev_type(device) in _GPU_DEVICE_TYPES:
            names.append((reg_name(dev_reg(device)) or b"gpu").decode("ascii", "replace"))
    return names


def _within(rows: list[_Rows], limit: int) -> list[list[_Rows]]:
    """`rows` in order, grouped so each group has at most `limit` rows in all (a chunk is
    never split: the preparer keeps each within the limit)."""
    groups: list[list[_Rows]] = [[]]
    size = 0
    for row in rows:
        n = len(row[2])
        if groups[-1] and size + n > limit:
            groups.append([])
            size = 0
        groups[-1].append(row)
        size += n
    return groups


def _check_decode(status: int, n_tokens: int) -> None:
    if status == 2:  # the abort callback said stop (`set_interrupt`)
        raise StepInterrupted(f"a step of {n_tokens} tokens was interrupted")
    if status == 1:
        raise KvCacheFull(f"no KV cache room for a batch of {n_tokens}")
    if status != 0:
        raise EngineError(f"llama_decode failed with status {status}")


# ggml_abort_callback: bool (*)(void * data); called with no arguments, the prototype
# gives the NULL function pointer that disarms it
_ABORT_CALLBACK_TYPE = ll.ggml_abort_callback
_NO_ABORT_CALLBACK = _ABORT_CALLBACK_TYPE()
_INTERRUPT_POLL_S = 0.002  # how often an armed decode asks its interrupt check

_Rows = tuple[int, int, np.ndarray, bool]  # seq_id, start_pos, embedding rows, logits


def _load_model(path: str, *, vocab_only: bool, n_gpu_layers: int = 0) -> Any:  # Any: model*
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file {path} does not exist: fix model.path / --model")
    _ensure_backend()
    params = ll.llama_model_default_params()
    params.vocab_only = vocab_only
    params.n_gpu_layers = n_gpu_layers
    model = ll.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {path}: is it a valid GGUF file?")
    return model


def _meta_str(model: Any, key: str) -> str | None:  # Any: model*
    buf = ctypes.create_string_buffer(4096)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


class LlamaTokenizer:
    """Text ⇄ token ids on a vocab-only load of the model (implements `Tokenizer`)."""

    def __init__(self, path: str, grammar_limits: GrammarLimits | None = None) -> None:
        self._model = _load_model(path, vocab_only=True)
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.grammar_limits = grammar_limits or GrammarLimits()
        # Built on the first constraint to validate, not at start: a server that never
        # sees one does not pay its memory (54 MB for Gemma 3's vocabulary).
        self._grammar_tokenizer: BackgroundGrammarTokenizer | None = None
        self._grammar_lock = threading.Lock()
        self.n_vocab: int = ll.llama_vocab_n_tokens(self._vocab)
        self.architecture: str = _meta_str(self._model, "general.architecture") or "unknown"
        # NOTE: a vocab-only load leaves hparams unset (llama_model_n_ctx_train is 0 there).
        ctx_train = _meta_str(self._model, f"{self.architecture}.context_length") or "0"
        self.n_ctx_train: int = int(ctx_train) if ctx_train.isdigit() else 0
        n_embd = _meta_str(self._model, f"{self.architecture}.embedding_length") or "0"
        self.n_embd: int = int(n_embd) if n_embd.isdigit() else 0
        template = ll.llama_model_chat_template(self._model, None)
        self._chat_template = template.decode("utf-8", "replace") if template else None
        self._bos_text = self._special_text(ll.llama_vocab_bos(self._vocab))
        self._eos_text = self._special_text(ll.llama_vocab_eos(self._vocab))

    def _special_text(self, token: int) -> str:
        if token < 0:
            return ""
        text = ll.llama_vocab_get_text(self._vocab, token)
        return text.decode("utf-8", "replace") if text else ""

    @property
    def bos_text(self) -> str:
        return self._bos_text

    @property
    def eos_text(self) -> str:
        return self._eos_text

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of `text`. Raises nothing for any str (lone surrogates are replaced)."""
        data = text.encode("utf-8", "replace")
        capacity = len(data) + 8
        tokens = (ll.llama_token * capacity)()
        n = ll.llama_tokenize(
            self._vocab, data, len(data), tokens, capacity, add_special, parse_special
        )
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            tokens = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(
                self._vocab, data, len(data), tokens, capacity, add_special, parse_special
            )
        return list(tokens[:n])

    def detokenize(self, token_ids: list[int]) -> str:
        return b"".join(token_piece(self._vocab, t) for t in token_ids).decode("utf-8", "replace")

    def token_bytes(self, token_id: int) -> bytes:
        return token_piece(self._vocab, token_id)

    def constraint_error(self, grammar: str) -> str | None:
        """None when llguidance can enforce `grammar` over this vocabulary, else why not."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                # it only validates, so it skips the mask-speed slices (half the memory)
                self._grammar_tokenizer = BackgroundGrammarTokenizer(self._vocab, masks=False)
        return validate_grammar(grammar, self._grammar_tokenizer.get(), self.grammar_limits)

    def close(self) -> None:
        with self._grammar_lock:
            if self._grammar_tokenizer is not None:
                self._grammar_tokenizer.wait()  # it reads the vocabulary
        if self._model:
            ll.llama_model_free(self._model)
            self._model = None


@dataclass(frozen=True, slots=True)
class ContextConfig:
    """How to build the worker's llama_context."""

    model_path: str
    n_ctx_per_seq: int
    n_seq_max: int
    n_batch: int
    n_threads: int
    n_threads_batch: int
    kv_unified: bool
    n_gpu_layers: int = 0
    lora: tuple[tuple[str, float], ...] = ()  # (adapter path, scale), applied to the context
    swa_full: bool = True  # False: sliding-window layers keep only the window (Gemma)
    n_cells: int | None = None  # KV cells in all; None: n_ctx_per_seq × n_seq_max


class LlamaCppBackend:
    """One model, one llama_context, many sequences; one `llama_decode` per step."""

    def __init__(self, config: ContextConfig) -> None:
        self.config = config
        self.offload: OffloadPlan | None = None  # set by the worker: where the model runs
        self._model = _load_model(
            config.model_path, vocab_only=False, n_gpu_layers=config.n_gpu_layers
        )
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self._vocab)
        self._ctx = self._init_context(config)
        if config.lora:
            self._apply_lora(config.lora)
        self._memory = ll.llama_get_memory(self._ctx)
        self._n_swa: int = ll.llama_model_n_swa(self._model)  # 0: no sliding window
        self.n_ctx_total: int = ll.llama_n_ctx(self._ctx)
        self.n_ctx_per_seq = config.n_ctx_per_seq
        self._batch = _NumpyBatch(config.n_batch)
        self._pieces: dict[int, bytes] = {}
        self.eog_token_ids: frozenset[int] = frozenset(
            t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self._vocab, t)
        )
        # started by the first constraint: ≈90–110 MB for Gemma's 262k tokens, not worth
        # holding in workers that never see one (the API process validates with its own)
        self._grammar_tokenizer: BackgroundGrammarTokenizer | None = None
        self._matchers: MatcherFactory | None = None  # built at the first constraint
        self._masker = LogitMasker(self.n_vocab)
        # a model with an mmproj (engine/image_prep.py): the embedding rows of image pseudo
        # tokens (negative ids); a chunk holds either those or tokens (scheduler/request.py)
        self.image_rows: Callable[[list[int]], np.ndarray] | None = None
        self.image_non_causal = False  # the vision model wants an image's rows bidirectional
        self.image_n_embd = 0  # the width of an embedding row (llama_model_n_embd_inp)
        # set_interrupt: llama.cpp's CPU backend calls the abort callback between graph
        # nodes (hundreds a decode), so it asks `check` at most every _INTERRUPT_POLL_S
        self._interrupt: Callable[[], bool] | None = None
        self._next_check = 0.0
        self._abort_callback = _ABORT_CALLBACK_TYPE(self._should_abort)  # kept referenced
        # (src, dst) of the whole-stream copies since the last llama_decode (`_settle`)
        self._pending_copies: list[tuple[int, int]] = []

    def _init_context(self, config: ContextConfig) -> Any:  # Any: context*
        params = ll.llama_context_default_params()
        # Both modes hold n_seq_max full contexts of cells by default; unified mode shares
        # them, and can be sized by tokens instead (runtime.kv_cache_sizing).
        n_cells = config.n_cells or config.n_ctx_per_seq * config.n_seq_max
        params.n_ctx = n_cells
        params.swa_full = config.swa_full
        params.n_batch = config.n_batch
        params.n_ubatch = min(config.n_batch, 512)
        params.n_seq_max = config.n_seq_max
        params.n_threads = config.n_threads
        params.n_threads_batch = config.n_threads_batch
        params.kv_unified = config.kv_unified
        params.no_perf = True
        ctx = ll.llama_init_from_model(self._model, params)
        if not ctx:
            ll.llama_model_free(self._model)
            raise ModelLoadError(
                f"llama.cpp could not create a context of {n_cells} cells for "
                f"{config.n_seq_max} sequences: lower model.ctx_size or scheduler.max_num_seqs"
            )
        return ctx

    def _apply_lora(self, lora: tuple[tuple[str, float], ...]) -> None:
        """Load the adapters and set them on the context, for every sequence. NOTE: the
        model frees them; a context holds one adapter set, so batches never mix sets."""
        adapters = (ll.llama_adapter_lora_p_ctypes * len(lora))()
        scales = (ctypes.c_float * len(lora))()
        for index, (path, scale) in enumerate(lora):
            adapter = ll.llama_adapter_lora_init(self._model, path.encode())
            if not adapter:
                self.close()
                raise ModelLoadError(
                    f"llama.cpp could not load the LoRA adapter {path}: is it a LoRA GGUF "
                    "made for this model's architecture and shapes?"
                )
            adapters[index], scales[index] = adapter, scale
        if ll.llama_set_adapters_lora(self._ctx, adapters, len(lora), scales) != 0:
            self.close()
            raise ModelLoadError("llama.cpp refused to apply the LoRA adapters")

    @property
    def model_handle(self) -> Any:  # Any: llama_model*
        """The loaded `llama_model*`, for another context over the same weights (embeddings).
        Valid until `close()`."""
        return self._model

    # -- tokens ------------------------------------------------------------------------
    def piece(self, token: int) -> bytes:
        """The bytes of `token` (cached; special tokens are empty)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = token_piece(self._vocab, token)
        return cached

    # -- sampling ----------------------------------------------------------------------
    def constraints_ready(self, wait_s: float = 0.0) -> bool:
        """True when a constrained sampler can be made without waiting (waits up to
        `wait_s` for that). The first call starts indexing the vocabulary for grammars on
        a thread (0.3 s for SmolLM2, 1.8 s for Gemma); until it is done, the caller holds
        its constrained requests back."""
        return self._grammar().done(wait_s)

    def _grammar(self) -> BackgroundGrammarTokenizer:
        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = BackgroundGrammarTokenizer(self._vocab)
        return self._grammar_tokenizer

    def make_sampler(self, params: SamplerSpec) -> Sampler:
        """A sampler for one sequence. Free it with `Sampler.close()`. Raises ValueError
        for a constraint llguidance rejects (the API validates first; this is the net).
        A constraint before `constraints_ready()` is True waits for the vocabulary index."""
        matcher = None
        if params.constraint is not None:
            if self._matchers is None:
                self._matchers = MatcherFactory(self._grammar().get())
            matcher = self._matchers.make(params.constraint)
        return Sampler(
            params,
            self.n_vocab,
            self.eog_token_ids,
            matcher,
            vocab=self._vocab,
            n_ctx=self.n_ctx_per_seq,
        )

    def sample(self, sampler: SamplerHandle, batch_index: int) -> int:
        """Sample from the logits of batch row `batch_index` (updates penalty history, and
        the constraint's state). Raises EngineError when the constraint admits nothing."""
        return cast(Sampler, sampler).sample(self._ctx, batch_index, self._masker)

    def logprobs(self, row: int, token_ids: list[int], top_k: int) -> list[Logprob]:
        """Raw-distribution log-probabilities of `token_ids` at consecutive rows ending at
        `row` (one token per row: token i is scored at row `row - len + 1 + i`)."""
        first = row - len(token_ids) + 1
        out: list[Logprob] = []
        for i, token in enumerate(token_ids):
            ptr = ll.llama_get_logits_ith(self._ctx, first + i)
            logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            peak = float(logits.max())
            log_z = peak + math.log(float(np.exp(logits - peak, dtype=np.float64).sum()))
            top: list[tuple[int, float]] = []
            if top_k > 0:
                k = min(top_k, self.n_vocab)
                ids = np.argpartition(-logits, k - 1)[:k]
                ids = ids[np.argsort(-logits[ids], kind="stable")]
                top = [(int(t), float(logits[t]) - log_z) for t in ids]
            out.append((float(logits[token]) - log_z, top))
        return out

    # -- decoding ----------------------------------------------------------------------
    def decode(self, chunks: list[DecodeChunk]) -> list[int]:
        """Run one `llama_decode` over `chunks` of (seq_id, token_ids, start_pos, n_logits).

        Returns, per chunk, the row of its last token's logits (-1 where n_logits is 0);
        the chunk's other logits rows are the ones just before it. Raises KvCacheFull when
        llama.cpp finds no KV room for the batch (nothing was computed), EngineError when
        it rejects or fails the batch otherwise (the batch's sequences may then hold KV of
        some of its positions: trim them back to their chunks' start positions).
        """
        rows = self._decode(chunks)
        self._pending_copies.clear()  # llama_decode ran them before the batch (`_settle`)
        return rows

    def _decode(self, chunks: list[DecodeChunk]) -> list[int]:
        if self.image_rows is None:  # a text-only model: no scan on the hot path
            return self._decode_tokens(chunks)
        is_image = [bool(c[1]) and c[1][0] < 0 for c in chunks]
        if not any(is_image):
            return self._decode_tokens(chunks)
        self._decode_images([c for c, image in zip(chunks, is_image, strict=True) if image])
        text = [c for c, image in zip(chunks, is_image, strict=True) if not image]
        text_rows = iter(self._decode_tokens(text) if text else [])
        return [-1 if image else next(text_rows) for image in is_image]

    def set_interrupt(self, check: Callable[[], bool] | None) -> None:
        """Arm or disarm interruption of the next decodes (`ModelBackend.set_interrupt`).
        Disarmed, llama.cpp calls nothing between nodes (no cost to the step)."""
        if check is None:
            if self._interrupt is not None:
                ll.llama_set_abort_callback(self._ctx, _NO_ABORT_CALLBACK, None)
            self._interrupt = None
            return
        if self._interrupt is None:
            ll.llama_set_abort_callback(self._ctx, self._abort_callback, None)
        self._interrupt = check
        self._next_check = time.perf_counter() + _INTERRUPT_POLL_S

    def _should_abort(self, _data: Any) -> bool:  # Any: void*
        """llama.cpp's abort callback, on the thread that called llama_decode."""
        check = self._interrupt
        if check is None:
            return False
        now = time.perf_counter()
        if now < self._next_check:
            return False
        self._next_check = now + _INTERRUPT_POLL_S
        try:
            return check()
        except Exception:  # an exception cannot cross into C: log it, finish the step
            logger.exception("the step's interrupt check failed")
            return False

    def _decode_tokens(self, chunks: list[DecodeChunk]) -> list[int]:
        rows = self._batch.fill(chunks)
        _check_decode(ll.llama_decode(self._ctx, self._batch.struct), self._batch.struct.n_tokens)
        return rows

    def _decode_images(self, chunks: list[DecodeChunk]) -> None:
        """One llama_decode of the image rows of `chunks` (embeddings, not tokens), before
        the step's tokens: a chunk is all image or all text, so each sequence's positions
        still go in order."""
        from inferflux.engine.backends.llama_cpp_vision import decode_embeddings

        assert self.image_rows is not None  # NOTE: decode() checked
        rows = [(seq, start, self.image_rows(ids), False) for seq, ids, start, _ in chunks]
        for group in _within(rows, self.config.n_batch):  # llama_decode takes ≤ n_batch
            status = decode_embeddings(
                self._ctx, self.image_n_embd, group, non_causal=self.image_non_causal
            )
            _check_decode(status, sum(len(r[2]) for r in group))

    @property
    def max_image_rows(self) -> int:
        """The most embedding rows one image chunk may have: a llama_decode takes n_batch
        at most, and a non-causal chunk must fit one ubatch."""
        n_ubatch = min(self.config.n_batch, 512)  # as _init_context sets it
        return n_ubatch if self.image_non_causal else self.config.n_batch

    def free_seq(self, seq_id: int) -> None:
        """Drop every KV cell of `seq_id` so the slot can serve another request."""
        ll.llama_memory_seq_rm(self._memory, seq_id, -1, -1)

    def copy_seq(self, src: int, dst: int, n_tokens: int) -> bool:
        """`dst` := the first `n_tokens` positions of `src`. False (dst empty) when `src`
        lacks window positions the next token needs (`_window_covers`).

        NOTE: with per-sequence KV llama.cpp copies whole streams only, a partial range aborts
        (docs/engine-notes.md): copy all of `src`, drop `dst`'s tail. Unified: cells shared.
        """
        ll.llama_memory_seq_rm(self._memory, dst, -1, -1)
        if not self._window_covers(src, n_tokens):
            return False
        if self.config.kv_unified:
            ll.llama_memory_seq_cp(self._memory, src, dst, 0, n_tokens)
            return True
        ll.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        self._pending_copies.append((src, dst))
        return self.trim_seq(dst, n_tokens)

    def _settle(self, seq_id: int, *, as_source: bool = False) -> None:
        """Run the pending stream copies now if `seq_id`'s bytes are about to be read (a
        copy's destination) or overwritten (`as_source`: either end).

        NOTE: across streams llama.cpp moves the cells' metadata at `llama_memory_seq_cp` but
        the K/V bytes at the next `llama_decode`: read before it, the destination gives its
        old bytes (a restored blob's logits were off by 32); a state loaded into either end
        is overwritten by the copy. No API runs the update alone, so one token is decoded
        into an empty sequence (or after `seq_id`'s last position) and removed."""
        pending = self._pending_copies
        if not any(seq_id == dst or (as_source and seq_id == src) for src, dst in pending):
            return
        empty = (s for s in range(self.config.n_seq_max) if self._pos_max(s) < 0)
        seq = next(empty, seq_id)
        pos = self._pos_max(seq) + 1
        self._decode_tokens([(seq, [0], pos, 0)])
        pending.clear()
        self.trim_seq(seq, pos)

    def _pos_max(self, seq_id: int) -> int:
        return int(ll.llama_memory_seq_pos_max(self._memory, seq_id))

    def keep_seq(self, seq_id: int, n_tokens: int) -> bool:
        """Cut `seq_id` to its first `n_tokens` positions in place (no copy); False
        (cleared) when it does not hold them all, or when the window they leave would not
        cover the next token."""
        if self._pos_max(seq_id) >= n_tokens - 1 and self._window_covers(seq_id, n_tokens):
            return self.trim_seq(seq_id, n_tokens)
        self.free_seq(seq_id)
        return False

    def _window_covers(self, seq_id: int, n_tokens: int) -> bool:
        """True when `seq_id`, cut to `n_tokens`, still holds what the next position
        attends to. Check before cutting: once cut, an emptied window is not visible.

        A sliding-window cache can hold only the last window of a sequence: with
        `swa_full` off always, and after `llama_state_seq_set_data` even with it on
        (measured on Gemma 3: a restored 1,200-token state has pos_min 688). Cut shorter
        than that window's start, the next token would attend to missing positions.
        NOTE: `llama_memory_seq_pos_min` reports the window's start."""
        needed_from = max(0, n_tokens - self._n_swa) if self._n_swa else 0
        return bool(ll.llama_memory_seq_pos_min(self._memory, seq_id) <= needed_from)

    def trim_seq(self, seq_id: int, n_tokens: int) -> bool:
        """Drop positions >= `n_tokens` of `seq_id`; on refusal clear the sequence."""
        if ll.llama_memory_seq_rm(self._memory, seq_id, n_tokens, -1):
            return True
        ll.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        return False

    # -- sequence state (engine/kv_state.py wraps these bytes) --------------------------
    def kv_layout(self) -> dict[str, int | bool | str]:
        """What sequence-state bytes depend on besides the weights (kv_state.py header)."""
        return kv_layout(self._model, self.config)

    def save_seq(self, seq_id: int) -> memoryview:
        """The KV of `seq_id` as llama.cpp state bytes (`llama_state_seq_get_data`), written
        in place into calloc'd memory (buffers.py: copies took 20× llama.cpp's own time)."""
        self._settle(seq_id)
        size = ll.llama_state_seq_get_size(self._ctx, seq_id)
        # NOTE: numpy's calloc'd memory: into a bytearray the 47 MB save took 21 ms, here 8
        data = np.zeros(size, np.uint8).data
        n = ll.llama_state_seq_get_data(self._ctx, in_place(data), size, seq_id)
        return data[:n]

    def seq_state_size(self, seq_id: int) -> int:
        """Bytes `save_seq_into` writes for `seq_id` now."""
        return int(ll.llama_state_seq_get_size(self._ctx, seq_id))

    def save_seq_into(self, seq_id: int, buffer: WritableBuffer, offset: int, size: int) -> int:
        """Write the KV of `seq_id` (`seq_state_size` bytes) straight into `buffer` (a
        shared-memory map: no copy in between) from `offset`; the bytes written, 0 on
        failure."""
        self._settle(seq_id)
        view = (ctypes.c_uint8 * size).from_buffer(buffer, offset)
        try:
            return int(ll.llama_state_seq_get_data(self._ctx, view, size, seq_id))
        finally:
            del view  # NOTE: an exported pointer keeps an mmap from closing

    def load_seq(
        self, seq_id: int, data: bytes | memoryview | WritableBuffer, n_tokens: int, offset: int = 0
    ) -> bool:
        """`seq_id` := the state in `data` (from `offset`), cut to its first `n_tokens`
        positions. False (and `seq_id` empty) when llama.cpp refused the bytes or they held
        fewer positions: a restore never silently does nothing. Any buffer (bytes, a
        shared-memory map) is read in place: a copy took 10× llama.cpp's own time."""
        self._settle(seq_id, as_source=True)
        ll.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
        size = len(data) - offset
        buf = in_place(data, offset)
        try:
            loaded = ll.llama_state_seq_set_data(self._ctx, buf, size, seq_id)
        finally:
            del buf
        if loaded == 0:
            ll.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
            return False
        pos_max = ll.llama_memory_seq_pos_max(self._memory, seq_id)
        if pos_max + 1 < n_tokens or not self._window_covers(seq_id, n_tokens):
            ll.llama_memory_seq_rm(self._memory, seq_id, -1, -1)
            return False
        return pos_max + 1 == n_tokens or self.trim_seq(seq_id, n_tokens)

    def kv_cells_used(self, seq_ids: list[int]) -> int:
        """Cells held by `seq_ids` (positions 0..pos_max of each)."""
        return sum(ll.llama_memory_seq_pos_max(self._memory, s) + 1 for s in seq_ids)

    def close(self) -> None:
        """Free the context and the model. The backend is unusable afterwards."""
        if self._grammar_tokenizer is not None:
            self._grammar_tokenizer.wait()
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            ll.llama_model_free(self._model)
            self._model = None


class _NumpyBatch:
    """A `llama_batch` whose arrays are numpy buffers, filled with slice assignments.

    `llama_batch_init` allocates one seq_id array per row; here all rows point into one
    contiguous int32 array, so a step fills tokens, positions and seq ids vectorised.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq_id = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        base = self.seq_id.ctypes.data
        self._seq_ptrs = (i32p * capacity)(
            *(ctypes.cast(base + 4 * i, i32p) for i in range(capacity))
        )
        self.struct = ll.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(i32p),
            embd=None,
            pos=self.pos.ctypes.data_as(i32p),
            n_seq_id=self.n_seq_id.ctypes.data_as(i32p),
            seq_id=self._seq_ptrs,
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    def fill(self, chunks: list[DecodeChunk]) -> list[int]:
        """Rows sorted by seq id (llama.cpp runs one ubatch, a pass over the weights, per run of
        consecutive ids in batch order: engine-notes.md); per chunk its last logits row."""
        rows = [-1] * len(chunks)
        n = 0
        for i in sorted(range(len(chunks)), key=lambda i: chunks[i][0]):
            seq_id, token_ids, start_pos, n_logits = chunks[i]
            k = len(token_ids)
            if n + k > self.capacity:
                raise EngineError(f"step of {n + k} tokens exceeds the batch of {self.capacity}")
            end = n + k
            self.token[n:end] = token_ids
            self.pos[n:end] = np.arange(start_pos, start_pos + k, dtype=np.int32)
            self.seq_id[n:end] = seq_id
            self.logits[n:end] = 0
            if n_logits:
                self.logits[end - min(int(n_logits), k) : end] = 1
            rows[i] = end - 1 if n_logits else -1
            n = end
        self.struct.n_tokens = n
        return rows


def kv_layout(model: Any, config: ContextConfig) -> dict[str, int | bool | str]:  # Any: model*
    """The context settings that sequence-state bytes depend on (the weights and LoRA
    adapters are named by the blob's model id instead)."""
    params = ll.llama_context_default_params()  # NOTE: _init_context leaves the types
    return {
        "n_ctx_per_seq": config.n_ctx_per_seq,
        "n_layer": ll.llama_model_n_layer(model),
        "n_embd": ll.llama_model_n_embd(model),
        "n_swa": ll.llama_model_n_swa(model),
        "swa_full": config.swa_full,
        "type_k": int(params.type_k),
        "type_v": int(params.type_v),
        "kv_unified": config.kv_unified,
    }
