"""Embeddings through llama.cpp: a second `llama_context` over the worker's loaded model.

Owns: the embedding context (`embeddings=True`, MEAN pooling, unified KV), one
`llama_decode` (or `llama_encode` for encoder models) over a batch of sequence chunks, and
reading each sequence's pooled vector with `llama_get_embeddings_seq`. Does not own: which
chunks go into a batch, how chunk means combine into one vector, normalization
(`engine/embed_queue.py` decides all three).

NOTE: the context uses n_batch = n_ubatch, so one decode is one ubatch and llama.cpp's
per-ubatch mean covers exactly the tokens of the chunk. With a KV memory (causal models)
a long input can span several decodes: the mean over the whole input is the
token-weighted mean of the chunk means (measured on SmolLM2: cos 1.0 against one big
ubatch, max abs difference 6e-6). A model without KV memory (BERT-like encoders) sees
each input in one piece, so its batch holds a whole context.

Thread rule: like `LlamaCppBackend`, one thread only; `close()` before the model is freed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import llama_cpp as ll
import numpy as np

from inferflux.engine.backends.base import DecodeChunk
from inferflux.engine.backends.llama_cpp import ContextConfig, _NumpyBatch
from inferflux.errors import EngineError, ModelLoadError

logger = logging.getLogger(__name__)

EMBED_MAX_BATCH_TOKENS = 512  # tokens per decode: bounds how long one embed batch stalls steps
EMBED_MAX_SEQS = 8  # inputs packed into one decode at most


@dataclass(frozen=True, slots=True)
class EmbedContextConfig:
    """Sizes of the embedding context."""

    n_ctx_per_seq: int  # the longest input (the API rejects longer ones)
    n_batch: int  # tokens per decode
    n_seq_max: int
    n_threads: int
    n_threads_batch: int

    @classmethod
    def for_worker(cls, context: ContextConfig, max_batch_tokens: int) -> EmbedContextConfig:
        """The embedding context of a worker whose generation context is `context`."""
        return cls(
            n_ctx_per_seq=context.n_ctx_per_seq,
            n_batch=max(16, min(max_batch_tokens, EMBED_MAX_BATCH_TOKENS)),
            n_seq_max=EMBED_MAX_SEQS,
            n_threads=context.n_threads,
            n_threads_batch=context.n_threads_batch,
        )


class LlamaCppEmbedder:
    """Pooled (mean) embeddings over an already loaded model (implements `EmbeddingBackend`).

    `max_batch_tokens`, `max_seq_tokens` (KV cells for all sequences in flight),
    `n_seq_max`, `n_embd`, `n_vocab` and `splits_sequences` tell the caller how to pack.
    """

    def __init__(self, model: Any, config: EmbedContextConfig) -> None:  # Any: llama_model*
        self._model = model
        self._encoder = bool(ll.llama_model_has_encoder(model))
        self.n_embd: int = ll.llama_model_n_embd(model)
        self.n_vocab: int = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
        self.n_seq_max = config.n_seq_max
        self._ctx = self._init_context(config, config.n_batch)
        self._memory = ll.llama_get_memory(self._ctx)
        # Without KV memory (BERT-like) llama_decode would only redirect to llama_encode.
        self._encoder = self._encoder or not self._memory
        self.splits_sequences = not self._encoder
        if self._encoder and config.n_batch < config.n_ctx_per_seq:
            # No KV to carry a sequence across decodes: one decode must hold a whole input.
            ll.llama_free(self._ctx)
            self._ctx = self._init_context(config, config.n_ctx_per_seq)
            self._memory = ll.llama_get_memory(self._ctx)
        self.max_batch_tokens: int = ll.llama_n_batch(self._ctx)
        self.max_seq_tokens: int = min(config.n_ctx_per_seq, ll.llama_n_ctx(self._ctx))
        self._batch = _NumpyBatch(self.max_batch_tokens)
        logger.info(
            "embedding context ready: n_embd %d, %d tokens per decode, %s",
            self.n_embd,
            self.max_batch_tokens,
            "chunked inputs" if self.splits_sequences else "whole inputs per decode",
        )

    def _init_context(self, config: EmbedContextConfig, n_batch: int) -> Any:  # Any: context*
        params = ll.llama_context_default_params()
        # Unified KV: every sequence may use any cell, so one long input plus a batch fits.
        params.n_ctx = config.n_ctx_per_seq + n_batch
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # NOTE: one ubatch per decode (see the module docstring)
        params.n_seq_max = config.n_seq_max
        params.n_threads = config.n_threads
        params.n_threads_batch = config.n_threads_batch
        params.kv_unified = True
        params.embeddings = True
        params.pooling_type = ll.LLAMA_POOLING_TYPE_MEAN
        params.no_perf = True
        ctx = ll.llama_init_from_model(self._model, params)
        if not ctx:
            raise ModelLoadError(
                f"llama.cpp could not create an embedding context of {params.n_ctx} cells"
            )
        return ctx

    def decode(self, chunks: list[DecodeChunk]) -> list[np.ndarray]:
        """One forward pass over `chunks` (each a distinct sequence); per chunk, the mean of
        its tokens' final hidden states (float32, not normalized). Raises EngineError; the
        KV of the batch's sequences is then undefined (free them)."""
        self._batch.fill([(s, t, p, len(t)) for s, t, p, _ in chunks])
        run = ll.llama_encode if self._encoder else ll.llama_decode
        status = run(self._ctx, self._batch.struct)
        if status != 0:
            raise EngineError(f"the embedding forward pass failed with status {status}")
        means: list[np.ndarray] = []
        for seq_id, _, _, _ in chunks:
            ptr = ll.llama_get_embeddings_seq(self._ctx, seq_id)
            if not ptr:
                raise EngineError(f"llama.cpp returned no pooled embedding for sequence {seq_id}")
            means.append(np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy())
        return means

    def free_seq(self, seq_id: int) -> None:
        """Drop the KV of `seq_id` (nothing to do for models without KV memory)."""
        if self._memory:
            ll.llama_memory_seq_rm(self._memory, seq_id, -1, -1)

    def close(self) -> None:
        """Free the context (not the model, which the generation backend owns)."""
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
