"""`EmbedQueue`: a worker's embedding requests, computed in bounded batches between steps.

Owns: validating an `EmbedRequest` against the embedding backend, packing the inputs of
every queued request into forward passes of at most `max_batch_tokens` tokens and
`n_seq_max` sequences, combining chunk means into one vector per input, normalizing, and
failing one request without touching the others. Does not own: llama.cpp calls
(`backends/llama_cpp_embed.py`) or transport (the worker sends the `EmbedOutcome`s).

The algorithm, one `step(max_tokens)` = one forward pass:
- admit waiting inputs, first come first served, while a sequence id is free and the KV
  cells of every admitted input (their full length) fit `max_seq_tokens`; a request that
  holds its share of the sequences (`n_seq_max` / the requests with work) lets the next
  one in first, so a request of 2,048 inputs never makes a later request of one input
  wait for all of them;
- give each admitted input its next chunk of at most the tokens left in the budget
  (`max_batch_tokens`, lowered by the worker's `max_tokens` and `max_seconds`: the
  tokens the measured speed of earlier passes fits in that time, at least
  `MIN_PASS_TOKENS`), the requests again taking turns at going first; a backend that
  cannot split a sequence takes whole inputs (one at least, so a pass always progresses);
- a chunk's mean, weighted by its token count, adds to its input's running sum; an input
  whose last chunk ran is done (sum / length) and frees its sequence id.
An input longer than the budget thus spans several steps, and generation steps run in
between: one step never stalls the engine for more than one bounded forward pass, and
while generations run that pass is small.

The backend is created lazily by the factory on the first request (a second context
costs memory that a server that never embeds should not pay). Thread rule: one thread.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from inferflux.engine.backends.base import DecodeChunk
from inferflux.engine.messages import EmbedRequest
from inferflux.errors import InferfluxError

logger = logging.getLogger(__name__)

MIN_PASS_TOKENS = 4  # a pass limited by time still makes this much progress


class EmbeddingBackend(Protocol):
    """A model context that returns one pooled (mean) vector per sequence chunk."""

    n_embd: int
    n_vocab: int
    n_seq_max: int
    max_batch_tokens: int  # tokens per forward pass
    max_seq_tokens: int  # KV cells shared by every sequence in flight (>= the longest input)
    splits_sequences: bool  # True: a sequence may span several forward passes

    def decode(self, chunks: list[DecodeChunk]) -> list[np.ndarray]:
        """Per chunk (distinct sequences), the mean hidden state over its tokens.
        Raises on failure (the batch's sequences must then be freed)."""
        ...

    def free_seq(self, seq_id: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EmbedOutcome:
    """A finished embedding request: `vectors` (len(inputs) × n_embd, float32) or `error`."""

    request_id: str
    vectors: np.ndarray | None
    num_tokens: int
    error: str | None = None


@dataclass(slots=True, eq=False)
class _Job:
    request_id: str
    normalize: bool
    vectors: np.ndarray
    num_pending: int
    num_tokens: int


@dataclass(slots=True, eq=False)
class _Input:
    job: _Job
    index: int
    token_ids: list[int]
    seq_id: int = -1
    num_done: int = 0
    total: np.ndarray = field(default_factory=lambda: np.zeros(0))


class EmbedQueue:
    """Embedding requests of one worker. Every method mutates; call from one thread."""

    def __init__(self, make_backend: Callable[[], EmbeddingBackend]) -> None:
        self._make_backend = make_backend
        self._backend: EmbeddingBackend | None = None
        # request id → its inputs not admitted yet; the first key is the next to admit
        self._waiting: dict[str, deque[_Input]] = {}
        self._running: list[_Input] = []
        self._jobs: dict[str, _Job] = {}
        self._turn = 0  # which request's inputs go first in the next pass
        self.seconds_per_token: float | None = None  # moving average over passes

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def add(self, request: EmbedRequest) -> list[EmbedOutcome]:
        """Queue `request`. Returns its failure at once when it can never run (invalid
        input, or no embedding context), else nothing."""
        try:
            backend = self._ensure_backend()
        except InferfluxError as exc:
            return [EmbedOutcome(request.request_id, None, 0, exc.message)]
        except Exception:  # NOTE: a failed context build must not take the worker down
            logger.exception("could not create the embedding context")
            return [EmbedOutcome(request.request_id, None, 0, "no embedding context")]
        problem = self._reject_reason(request, backend)
        if problem is not None:
            return [EmbedOutcome(request.request_id, None, 0, problem)]
        job = _Job(
            request_id=request.request_id,
            normalize=request.normalize,
            vectors=np.zeros((len(request.inputs), backend.n_embd), dtype=np.float32),
            num_pending=len(request.inputs),
            num_tokens=sum(len(ids) for ids in request.inputs),
        )
        self._jobs[job.request_id] = job
        self._waiting[job.request_id] = deque(
            _Input(job, index, token_ids, total=np.zeros(backend.n_embd, dtype=np.float64))
            for index, token_ids in enumerate(request.inputs)
        )
        return []

    def _ensure_backend(self) -> EmbeddingBackend:
        if self._backend is None:
            self._backend = self._make_backend()
        return self._backend

    def _reject_reason(self, request: EmbedRequest, backend: EmbeddingBackend) -> str | None:
        if request.request_id in self._jobs:
            return f"duplicate request id {request.request_id}"
        if not request.inputs:
            return "no inputs to embed"
        limit = backend.max_seq_tokens
        if not backend.splits_sequences:
            limit = min(limit, backend.max_batch_tokens)
        for index, token_ids in enumerate(request.inputs):
            if not token_ids:
                return f"input {index} is empty"
            if len(token_ids) > limit:
                return f"input {index} has {len(token_ids)} tokens; the limit is {limit}"
            if min(token_ids) < 0 or max(token_ids) >= backend.n_vocab:
                return f"input {index} has a token id outside the vocabulary of {backend.n_vocab}"
        return None

    def abort(self, request_ids: list[str]) -> None:
        """Drop these requests (no outcome is sent). Unknown ids are ignored."""
        gone = {rid for rid in request_ids if self._jobs.pop(rid, None) is not None}
        if gone:
            for request_id in gone:
                self._waiting.pop(request_id, None)
            self._release([i for i in self._running if i.job.request_id in gone])

    def step(
        self, max_tokens: int | None = None, max_seconds: float | None = None
    ) -> list[EmbedOutcome]:
        """One forward pass over the next chunks, of at most `max_tokens` tokens and about
        `max_seconds` (None: the backend's batch); the requests it completed or failed."""
        if not self.has_work() or self._backend is None:
            return []
        backend = self._backend
        self._admit(backend)
        batch = self._plan(backend, self._budget(backend, max_tokens, max_seconds))
        if not batch:
            return []
        chunks: list[DecodeChunk] = [
            (item.seq_id, item.token_ids[item.num_done : item.num_done + n], item.num_done, n)
            for item, n in batch
        ]
        started = time.monotonic()
        try:
            means = backend.decode(chunks)
        except Exception as exc:  # NOTE: one batch's failure must not take the worker down
            logger.exception("an embedding batch of %d sequences failed", len(chunks))
            message = exc.message if isinstance(exc, InferfluxError) else "embedding failed"
            return self._fail_jobs({item.job for item, _ in batch}, message)
        self._measure(time.monotonic() - started, sum(n for _, n in batch))
        return self._accumulate(batch, means)

    def _budget(
        self, backend: EmbeddingBackend, max_tokens: int | None, max_seconds: float | None
    ) -> int:
        """Tokens for the next pass: the backend's batch, lowered by the limits."""
        budget = backend.max_batch_tokens
        if max_tokens is not None:
            budget = min(budget, max_tokens)
        if max_seconds is not None and self.seconds_per_token:
            fits = int(max_seconds / self.seconds_per_token)
            budget = min(budget, max(fits, MIN_PASS_TOKENS))
        return budget

    def _measure(self, seconds: float, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        sample = seconds / num_tokens
        old = self.seconds_per_token
        self.seconds_per_token = sample if old is None else 0.8 * old + 0.2 * sample

    def _admit(self, backend: EmbeddingBackend) -> None:
        used_ids = {item.seq_id for item in self._running}
        cells = sum(len(item.token_ids) for item in self._running)
        held = Counter(item.job.request_id for item in self._running)
        while self._waiting and len(self._running) < backend.n_seq_max:
            request_id = self._next_to_admit(held, backend.n_seq_max)
            queue = self._waiting[request_id]
            head = queue[0]
            if cells + len(head.token_ids) > backend.max_seq_tokens:
                break
            queue.popleft()
            if not queue:
                del self._waiting[request_id]
            held[request_id] += 1
            head.seq_id = min(set(range(backend.n_seq_max)) - used_ids)
            used_ids.add(head.seq_id)
            cells += len(head.token_ids)
            self._running.append(head)

    def _next_to_admit(self, held: Counter[str], n_seq_max: int) -> str:
        """The first waiting request (in arrival order) below its share of the sequences,
        else the first waiting request (a free sequence never idles)."""
        with_work = set(self._waiting) | set(held)
        share = -(-n_seq_max // len(with_work))
        return next((r for r in self._waiting if held[r] < share), next(iter(self._waiting)))

    def _plan(self, backend: EmbeddingBackend, budget: int) -> list[tuple[_Input, int]]:
        batch: list[tuple[_Input, int]] = []
        for item in self._in_turn():
            left = len(item.token_ids) - item.num_done
            take = min(left, budget)
            if not backend.splits_sequences and left > budget:
                if batch:
                    break
                take = left  # NOTE: a whole input alone (it fits the backend's batch)
            if take <= 0:
                break
            batch.append((item, take))
            budget -= take
            if budget <= 0:
                break
        self._turn += 1
        return batch

    def _in_turn(self) -> list[_Input]:
        """The running inputs, the requests taking turns at going first (stable within
        a request)."""
        order = list(dict.fromkeys(item.job.request_id for item in self._running))
        if len(order) <= 1:
            return self._running
        first = self._turn % len(order)
        rank = {request_id: (i - first) % len(order) for i, request_id in enumerate(order)}
        return sorted(self._running, key=lambda item: rank[item.job.request_id])

    def _accumulate(
        self, batch: list[tuple[_Input, int]], means: list[np.ndarray]
    ) -> list[EmbedOutcome]:
        outcomes: list[EmbedOutcome] = []
        finished: list[_Input] = []
        for (item, n), mean in zip(batch, means, strict=True):
            item.total += mean.astype(np.float64) * n
            item.num_done += n
            if item.num_done < len(item.token_ids):
                continue
            finished.append(item)
            job = item.job
            job.vectors[item.index] = item.total / len(item.token_ids)
            job.num_pending -= 1
            if job.num_pending == 0 and self._jobs.pop(job.request_id, None) is not None:
                outcomes.append(self._complete(job))
        self._release(finished)
        return outcomes

    def _complete(self, job: _Job) -> EmbedOutcome:
        vectors = job.vectors
        if job.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.where(norms > 0.0, norms, 1.0)
        return EmbedOutcome(job.request_id, vectors.astype(np.float32), job.num_tokens)

    def _fail_jobs(self, jobs: set[_Job], message: str) -> list[EmbedOutcome]:
        for job in jobs:
            self._jobs.pop(job.request_id, None)
            self._waiting.pop(job.request_id, None)
        self._release([i for i in self._running if i.job in jobs])
        return [EmbedOutcome(job.request_id, None, 0, message) for job in jobs]

    def _release(self, items: list[_Input]) -> None:
        """Free the sequences of `items` and drop them from the running set."""
        if not items:
            return
        for item in items:
            if self._backend is not None:
                self._backend.free_seq(item.seq_id)
        dropped = {id(item) for item in items}
        self._running = [i for i in self._running if id(i) not in dropped]

    def close(self) -> None:
        """Free the backend (if it was ever created); pending requests are dropped."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None
