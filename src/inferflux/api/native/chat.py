"""POST /chat: messages → chat template → tokens → engine → the native JSON response or SSE.

Owns the route only; shapes live in `protocol.py`, the engine round trip in `generation.py`.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import ServingState, json_body
from inferflux.api.model_router import serving_for
from inferflux.api.native.generate import STREAM_OR_JSON
from inferflux.api.native.generation import Outcome, build_request, respond
from inferflux.api.native.protocol import (
    NativeAssistantMessage,
    NativeChatRequest,
    NativeChatResponse,
)
from inferflux.api.openai.generation import check_model, tokenize

router = APIRouter(tags=["native"])

ChatBody = Annotated[NativeChatRequest, Depends(json_body(NativeChatRequest))]


ChatServing = Annotated[ServingState, Depends(serving_for(NativeChatRequest))]


@router.post("/chat", responses={200: {"model": NativeChatResponse, **STREAM_OR_JSON}})
async def chat(request: Request, body: ChatBody, serving: ChatServing) -> Response:
    """A multi-turn conversation, rendered with the model's chat template; SSE or not."""
    started_at = time.monotonic()
    created = int(time.time())
    model = check_model(body.model, serving.model_info)
    text = serving.chat_template.render([message.model_dump() for message in body.messages])
    bos = serving.tokenizer.bos_text
    token_ids = await tokenize(
        serving.tokenizer, text, add_special=not (bos and text.startswith(bos))
    )
    add = build_request("chat", body, token_ids, serving.model_info, "messages")

    def build(outcome: Outcome) -> Response:
        response = NativeChatResponse(
            request_id=add.request_id,
            created=created,
            model=model,
            message=NativeAssistantMessage(content=outcome.text),
            finish_reason=outcome.finish_reason,
            usage=outcome.usage,
            timings=outcome.timings,
        )
        return Response(response.model_dump_json(), media_type="application/json")

    return await respond(
        request, serving.engine, add, stream=body.stream, started_at=started_at, build=build
    )
