"""`ResidentModel`: one loaded model, the requests that hold it, and its retirement.

Owns: building a model's `ServingState` (`build_serving`: chat template, constraint
compiler, the served engine, the fingerprint), counting the leases (an HTTP request holds
the model from the moment the route resolves it until its response is fully sent), and
`retire`: no new leases, wait for the held ones to end (up to a drain timeout), stop the
workers (their KV and prefix cache go with them) and free the vocab-only tokenizer. Does
not own: which models are resident (residency.py) or which one a name routes to
(names.py).

One event loop: every method runs on it; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inferflux import __version__
from inferflux.config.settings import Settings
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler, grammar_limits
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer
from inferflux.models.serving import EngineWrapper, ServingState
from inferflux.models.spec import ModelSpec

logger = logging.getLogger(__name__)


def system_fingerprint(model_info: ModelInfo) -> str:
    """OpenAI's `system_fingerprint`: changes when the server version, the model file or
    its LoRA adapters or mmproj do."""
    adapters = ",".join(f"{a.sha256}*{a.scale:g}" for a in model_info.adapters)
    key = (
        f"{__version__}|{model_info.model_id}|{model_info.size_bytes}|{model_info.created}"
        f"|{model_info.sha256}|{adapters}"
    )
    if model_info.mmproj:  # the projector shapes the answers too
        key += f"|{model_info.mmproj_sha256 or model_info.mmproj}"
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


def build_serving(
    settings: Settings,
    engine: EngineClient,
    tokenizer: Tokenizer,
    model_info: ModelInfo,
    wrap: EngineWrapper,
) -> ServingState:
    """The API's view of one model. `settings` are the model's own (per-model values
    applied); `wrap` gives the engine the API sees. Raises ModelLoadError when the chat
    template does not compile."""
    chat_template = ChatTemplate.from_model(
        settings.model.chat_template or tokenizer.chat_template,
        model_info.architecture,
        tokenizer.bos_text,
        tokenizer.eos_text,
    )
    return ServingState(
        settings=settings,
        engine=wrap(engine, tokenizer, model_info),
        tokenizer=tokenizer,
        model_info=model_info,
        chat_template=chat_template,
        constraints=ConstraintCompiler(tokenizer.constraint_error, grammar_limits(settings)),
        system_fingerprint=system_fingerprint(model_info),
        started_at=time.monotonic(),
    )


@dataclass(slots=True, eq=False)
class ResidentModel:
    """One loaded model. `close` frees what the engine does not own (the tokenizer); it
    runs only once no request can touch the model any more. Its `serving` carries the
    spec's request defaults (Ollama `system` and `parameters`)."""

    spec: ModelSpec
    serving: ServingState
    close: Callable[[], None] | None = None
    load_s: float = 0.0  # verify + vocab load + first worker ready
    last_used_at: float = field(default_factory=time.monotonic)
    keep_alive_s: float | None = None  # Ollama keep_alive: unload once idle this long
    expires_at: float | None = None  # keep_alive deadline (monotonic); None = no deadline
    num_leases: int = 0
    retiring: bool = False
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _stopping: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self._idle.set()
        spec, serving = self.spec, self.serving
        if (serving.system, serving.parameters) != (spec.system, spec.parameters):
            self.serving = dataclasses.replace(
                serving, system=spec.system, parameters=spec.parameters
            )

    @property
    def model_id(self) -> str:
        return self.spec.model_id

    def try_acquire(self) -> bool:
        """Hold the model for one request; False once it is retiring (resolve again)."""
        if self.retiring:
            return False
        self.num_leases += 1
        self.last_used_at = time.monotonic()
        self._idle.clear()
        return True

    def release(self) -> None:
        self.num_leases -= 1
        self.last_used_at = time.monotonic()
        if self.num_leases == 0:
            self._idle.set()
            self.refresh_expiry()

    def refresh_expiry(self) -> None:
        """Start the keep_alive countdown from now (no deadline without keep_alive)."""
        if self.keep_alive_s is not None:
            self.expires_at = time.monotonic() + self.keep_alive_s

    async def stop(self) -> None:
        """Stop the workers, once: a second caller (server shutdown during a retirement)
        waits for the same shutdown instead of starting another."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self.serving.engine.shutdown())
        await asyncio.shield(self._stopping)

    async def retire(self, drain_timeout_s: float) -> None:
        """Stop taking requests, let the held ones finish (at most `drain_timeout_s`),
        then stop the workers and free the tokenizer. Never raises."""
        self.retiring = True
        drained = True
        try:
            await asyncio.wait_for(self._idle.wait(), drain_timeout_s)
        except TimeoutError:
            drained = False
            logger.warning(
                "model %s: %d requests still running after %.0fs; stopping its workers",
                self.model_id,
                self.num_leases,
                drain_timeout_s,
            )
        try:
            await self.stop()
        except Exception:  # NOTE: retirement must finish; the workers die with their sockets
            logger.exception("model %s: engine shutdown failed", self.model_id)
        # NOTE: a request still holding the model could call the tokenizer: freeing it
        # then would crash the process, so a forced retirement leaves it to the GC.
        if drained and self.close is not None:
            try:
                await asyncio.to_thread(self.close)
            except Exception:  # NOTE: a leak at worst; retirement still completes
                logger.exception("model %s: freeing the tokenizer failed", self.model_id)
        logger.info("model %s retired", self.model_id)


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS.

    NOTE: a vocab-only load and its grammar index are tens of MB (Gemma's 262k tokens),
    allocated on a loader thread's malloc arena; glibc keeps freed arena pages until
    `malloc_trim`, so without it a retired model's memory would look leaked.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
