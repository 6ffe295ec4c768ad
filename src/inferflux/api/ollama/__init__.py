"""Ollama-compatible routes (`/api/*` and `/`): Ollama clients work unchanged.

Modules: `protocol` (request bodies, options → sampling, `format`), `render` (NDJSON,
metrics: the generation service's events as Ollama's lines), `generate`, `chat`, `embed`,
`models` (tags, show, ps, version, `/`), and the admin-only `manage` (delete, copy,
create) and `blobs` (uploads for create), included by the app with the admin scope.
Errors on `/api/*` use Ollama's `{"error": "..."}` body (`api/errors.py`). `router`
bundles the public and generation routes (not `manage` and `blobs`).
"""

from fastapi import APIRouter

from inferflux.api.ollama import chat, embed, generate, models

router = APIRouter()
for _module in (generate, chat, embed, models):
    router.include_router(_module.router)

__all__ = ["router"]
