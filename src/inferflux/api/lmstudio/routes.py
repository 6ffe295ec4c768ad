"""LM Studio's generation routes: `POST /api/v0/chat/completions`, `/api/v0/completions`,
`/api/v0/embeddings` (generate scope).

The OpenAI frontend's handlers (api/openai/), mounted under `/api/v0/`: the same bodies,
checks, models and errors (OpenAI's envelope); a collected chat or text completion gets
LM Studio's `stats`, `model_info` and `runtime` (render.py). Streams and embeddings are
OpenAI's as they are, as LM Studio sends them.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from inferflux.api.lmstudio.render import lmstudio_renderer
from inferflux.api.openai.chat import ChatBody, ChatServing, chat_completion
from inferflux.api.openai.completions import CompletionBody, CompletionServing, text_completion
from inferflux.api.openai.embeddings import create_embeddings
from inferflux.api.state import ContextDep, GenerationDep

LMSTUDIO_PREFIX = "/api/v0"

router = APIRouter(prefix=LMSTUDIO_PREFIX, tags=["lmstudio"])


@router.post("/chat/completions")
async def lmstudio_chat_completion(
    request: Request,
    body: ChatBody,
    serving: ChatServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """OpenAI's chat completion, with LM Studio's `stats`, `model_info`, `runtime`."""
    decorate = lmstudio_renderer(serving.model_info)
    return await chat_completion(request, body, serving, context, generation, decorate)


@router.post("/completions")
async def lmstudio_text_completion(
    request: Request,
    body: CompletionBody,
    serving: CompletionServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """OpenAI's text completion, with LM Studio's `stats`, `model_info`, `runtime`."""
    decorate = lmstudio_renderer(serving.model_info)
    return await text_completion(request, body, serving, context, generation, decorate)


router.add_api_route(
    "/embeddings",
    create_embeddings,
    methods=["POST"],
    name="lmstudio_embeddings",
    summary="LM Studio embeddings (OpenAI's)",
)
