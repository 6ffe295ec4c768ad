"""The engine: EngineClient (asyncio) ⇄ worker processes ⇄ EngineCore ⇄ llama.cpp backend.

The API process starts a model's workers with `make_engine_client(settings, model_info)`;
the vocab-only load (`ModelInfo` + `Tokenizer`) is the models package's (models/files.py).
"""

from inferflux.engine.client import make_engine_client
from inferflux.engine.messages import (
    OPENAI_FINISH_REASON,
    AddRequest,
    FinishReason,
    RequestDelta,
    SamplingParams,
)
from inferflux.engine.protocol import EngineClient, ModelInfo, Tokenizer, WorkerStatus

__all__ = [
    "OPENAI_FINISH_REASON",
    "AddRequest",
    "EngineClient",
    "FinishReason",
    "ModelInfo",
    "RequestDelta",
    "SamplingParams",
    "Tokenizer",
    "WorkerStatus",
    "make_engine_client",
]
