"""The engine: EngineClient (asyncio) ⇄ worker processes ⇄ EngineCore ⇄ llama.cpp backend.

The API process starts a model's workers with `make_engine_client(settings, model_info)`;
the vocab-only load (`ModelInfo` + `Tokenizer`) is the models package's (models/files.py).
"""

# NOTE: first, before anything imports numpy or pyzmq: loading libllama after either of
# them segfaulted llama_model_load_from_file with one CUDA build (BENCHMARKS.md, "GPU
# (issue 10)"). Every process that serves (the API process, its tokenizer, each spawned
# worker, whose target lives under this package) imports this package before those.
# tests/unit/engine/test_import_order.py checks the order in fresh interpreters.
from inferflux.engine.backends import llama_cpp as _llama_cpp  # noqa: F401  # isort: split
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
