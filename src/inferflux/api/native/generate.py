"""POST /generate: a raw prompt → the generation service → the native JSON response or SSE
stream.

Owns the route only; shapes live in `protocol.py`, the spec and the events in `render.py`.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import Generation, TextPrompt, answer_model, respond
from inferflux.api.model_lease import serving_for
from inferflux.api.native.protocol import NativeGenerateRequest, NativeGenerateResponse
from inferflux.api.native.render import NativeRenderer, Outcome, native_spec
from inferflux.api.openapi import event_stream
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.models.serving import ServingState

router = APIRouter(tags=["native"])

GenerateBody = Annotated[NativeGenerateRequest, Depends(json_body(NativeGenerateRequest))]

# The 200 answer: JSON, or with stream=true one `NativeStreamEvent` per SSE event.
STREAM_OR_JSON: dict[str, object] = {
    "description": "The generation (JSON), or with stream=true an SSE stream of NativeStreamEvent",
    "content": event_stream("NativeStreamEvent"),
}


GenerateServing = Annotated[ServingState, Depends(serving_for(NativeGenerateRequest))]


@router.post("/generate", responses={200: {"model": NativeGenerateResponse, **STREAM_OR_JSON}})
async def generate(
    request: Request,
    body: GenerateBody,
    serving: GenerateServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Continue `prompt` (no chat template); streaming (SSE) or not."""
    created = int(time.time())
    model = answer_model(body.model, serving.model_info, context.caller)
    spec = native_spec("gen", body, TextPrompt(body.prompt, add_special=True), "prompt")

    def build(outcome: Outcome) -> Response:
        response = NativeGenerateResponse(
            request_id=outcome.request_id,
            created=created,
            model=model,
            text=outcome.text,
            finish_reason=outcome.finish_reason,
            usage=outcome.usage,
            timings=outcome.timings,
        )
        return Response(response.model_dump_json(), media_type="application/json")

    def renderer_for(started: Generation) -> NativeRenderer:
        return NativeRenderer(started.response_id, build)

    start = generation.start(serving, spec, context)
    return await respond(request, start, renderer_for, stream=body.stream)
