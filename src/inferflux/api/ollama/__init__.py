"""Ollama-compatible routes (`/api/*` and `/`): Ollama clients work unchanged.

Modules: `protocol` (request bodies, options → sampling, `format`), `render` (NDJSON,
metrics: the generation service's events as Ollama's lines), `generate`, `chat`, `embed`,
`models` (tags, show, ps, version, `/`). Errors on `/api/*` use Ollama's
`{"error": "..."}` body (`api/errors.py`). `router` bundles every route.
"""

from fastapi import APIRouter

from inferflux.api.ollama import chat, embed, generate, models

router = APIRouter()
for _module in (generate, chat, embed, models):
    router.include_router(_module.router)

__all__ = ["router"]
