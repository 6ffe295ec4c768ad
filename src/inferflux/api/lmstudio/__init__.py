"""LM Studio's REST API (v0, `/api/v0/*`): what LM Studio clients call, in OpenAI's shapes.

Modules: `models` (`GET /api/v0/models`, `/api/v0/models/{id}`: LM Studio's model
objects, from the GGUF facts), `routes` (chat, text completions and embeddings: the
OpenAI frontend's handlers mounted under `/api/v0/`), `render` (LM Studio's additions to
a collected answer: `stats`, `model_info`, `runtime`). Errors are OpenAI's envelope,
although the paths start with `/api/` (`api/errors.py`, `is_ollama_path`).
"""

from inferflux.api.lmstudio import models, routes

__all__ = ["models", "routes"]
