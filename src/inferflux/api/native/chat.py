"""POST /chat: messages for the model's chat template → the generation service → the
native JSON response or SSE.

A user turn's `images` (base64 or data URIs) stand before its text (api/images; a model
without an mmproj answers 400). Owns the route only; shapes live in `protocol.py`, the
spec and the events in `render.py`.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import ChatPrompt, Generation, answer_model, respond
from inferflux.api.images import ImageSet
from inferflux.api.model_lease import serving_for
from inferflux.api.native.generate import STREAM_OR_JSON
from inferflux.api.native.protocol import (
    NativeAssistantMessage,
    NativeChatRequest,
    NativeChatResponse,
)
from inferflux.api.native.render import NativeRenderer, Outcome, native_spec
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.models.serving import ServingState

router = APIRouter(tags=["native"])

ChatBody = Annotated[NativeChatRequest, Depends(json_body(NativeChatRequest))]


ChatServing = Annotated[ServingState, Depends(serving_for(NativeChatRequest))]


@router.post("/chat", responses={200: {"model": NativeChatResponse, **STREAM_OR_JSON}})
async def chat(
    request: Request,
    body: ChatBody,
    serving: ChatServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """A multi-turn conversation, rendered with the model's chat template; SSE or not."""
    created = int(time.time())
    model = answer_model(body.model, serving.model_info, context.caller)
    images = ImageSet()
    prompt = ChatPrompt(body.template_messages(images), images=images or None)
    spec = native_spec("chat", body, prompt, "messages")

    def build(outcome: Outcome) -> Response:
        response = NativeChatResponse(
            request_id=outcome.request_id,
            created=created,
            model=model,
            message=NativeAssistantMessage(content=outcome.text),
            finish_reason=outcome.finish_reason,
            usage=outcome.usage,
            timings=outcome.timings,
        )
        return Response(response.model_dump_json(), media_type="application/json")

    def renderer_for(started: Generation) -> NativeRenderer:
        return NativeRenderer(started.response_id, build)

    start = generation.start(serving, spec, context)
    return await respond(request, start, renderer_for, stream=body.stream)
