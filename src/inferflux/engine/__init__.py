"""The engine: EngineClient (asyncio) ⇄ worker processes ⇄ EngineCore ⇄ llama.cpp backend.

The API process uses two entry points: `load_served_model(settings)` (vocab-only load:
`ModelInfo` + `Tokenizer`) and `make_engine_client(settings, model_info)`.
"""

from inferflux.engine.client import make_engine_client
from inferflux.engine.messages import (
    OPENAI_FINISH_REASON,
    AddRequest,
    FinishReason,
    RequestDelta,
    SamplingParams,
)
from inferflux.engine.model_files import load_served_model
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
    "load_served_model",
    "make_engine_client",
]
