"""`EmbedDispatch`: embedding requests from the API process to a `WorkerPool`'s workers.

Owns: one future per embedding request in flight (resolved by the worker's `EmbedResult`,
failed when its worker dies, hangs or is removed), resubmitting a request whose worker
died to another ready worker (embedding is idempotent, spec REQ 9.4), aborting one whose
caller gave up, and turning the result's float32 bytes into vectors. Does not own: which
worker gets a request (a callback: the client's router), nor the workers' embedding
passes (engine/embed_queue.py, in the worker).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import numpy as np

from inferflux.engine.messages import EmbedRequest, EmbedResult, encode
from inferflux.engine.protocol import EmbeddingResult
from inferflux.engine.worker_pool import MAX_RESUBMITS, RESUBMIT_WAIT_S, PoolWorker, WorkerPool
from inferflux.errors import EngineDeadError, EngineError

logger = logging.getLogger(__name__)


class EmbedDispatch:
    """Embeddings over `pool`; `pick()` names the worker for the next attempt."""

    def __init__(self, pool: WorkerPool, pick: Callable[[], PoolWorker]) -> None:
        self._pool = pool
        self._pick = pick
        self._embeds: dict[str, tuple[asyncio.Future[EmbedResult], PoolWorker]] = {}

    async def embed(self, inputs: list[list[int]], *, normalize: bool = True) -> EmbeddingResult:
        request = EmbedRequest(
            request_id=f"embd-{uuid.uuid4().hex}", inputs=inputs, normalize=normalize
        )
        data = encode(request)
        # NOTE: embedding is idempotent: a request whose worker died is resubmitted to
        # another ready worker (spec REQ 9.4), as `generate` does before any output.
        attempt = 0
        while True:
            try:
                result = await self._embed_on(self._pick(), request.request_id, data)
            except EngineDeadError:
                attempt += 1
                if attempt > MAX_RESUBMITS or self._pool.closing:
                    raise
                logger.warning("resubmitting %s after its worker died", request.request_id)
                await self._pool.wait_ready(RESUBMIT_WAIT_S)
                continue
            vectors = np.frombuffer(result.embeddings, dtype="<f4").reshape(-1, result.n_embd)
            return EmbeddingResult(vectors=vectors.tolist(), num_prompt_tokens=result.num_tokens)

    async def _embed_on(self, worker: PoolWorker, request_id: str, data: bytes) -> EmbedResult:
        future: asyncio.Future[EmbedResult] = asyncio.get_running_loop().create_future()
        self._embeds[request_id] = (future, worker)
        worker.in_flight.add(request_id)
        try:
            await self._pool.send(worker, data)
            return await future
        finally:
            self._embeds.pop(request_id, None)
            worker.in_flight.discard(request_id)
            if not future.done() or future.cancelled():  # the caller gave up: drop it there
                await self._pool.send_abort(worker, request_id)

    def resolve(self, message: EmbedResult) -> None:
        """A worker's answer to an embedding request (ignored once the caller gave up)."""
        entry = self._embeds.get(message.request_id)
        if entry is None or entry[0].done():
            return
        if message.error is not None:
            error = EngineError(f"embedding failed in the engine: {message.error}")
            entry[0].set_exception(error)
        else:
            entry[0].set_result(message)

    def fail(self, worker: PoolWorker, error: Exception) -> None:
        """`worker` is gone: its embedding requests fail with `error`."""
        for future, owner in list(self._embeds.values()):
            if owner is worker and not future.done():
                future.set_exception(error)
