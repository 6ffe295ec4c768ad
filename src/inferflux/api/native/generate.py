"""POST /generate: a raw prompt → tokens → engine → the native JSON response or SSE stream.

Owns the route only; shapes live in `protocol.py`, the engine round trip in `generation.py`.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import ServingState, json_body
from inferflux.api.model_router import serving_for
from inferflux.api.native.generation import Outcome, build_request, respond
from inferflux.api.native.protocol import NativeGenerateRequest, NativeGenerateResponse
from inferflux.api.openai.generation import check_model, tokenize
from inferflux.api.openapi import event_stream

router = APIRouter(tags=["native"])

GenerateBody = Annotated[NativeGenerateRequest, Depends(json_body(NativeGenerateRequest))]

# The 200 answer: JSON, or with stream=true one `NativeStreamEvent` per SSE event.
STREAM_OR_JSON: dict[str, object] = {
    "description": "The generation (JSON), or with stream=true an SSE stream of NativeStreamEvent",
    "content": event_stream("NativeStreamEvent"),
}


GenerateServing = Annotated[ServingState, Depends(serving_for(NativeGenerateRequest))]


@router.post("/generate", responses={200: {"model": NativeGenerateResponse, **STREAM_OR_JSON}})
async def generate(request: Request, body: GenerateBody, serving: GenerateServing) -> Response:
    """Continue `prompt` (no chat template); streaming (SSE) or not."""
    started_at = time.monotonic()
    created = int(time.time())
    model = check_model(body.model, serving.model_info)
    token_ids = await tokenize(serving.tokenizer, body.prompt, add_special=True)
    add = build_request("gen", body, token_ids, serving.model_info, "prompt")

    def build(outcome: Outcome) -> Response:
        response = NativeGenerateResponse(
            request_id=add.request_id,
            created=created,
            model=model,
            text=outcome.text,
            finish_reason=outcome.finish_reason,
            usage=outcome.usage,
            timings=outcome.timings,
        )
        return Response(response.model_dump_json(), media_type="application/json")

    return await respond(
        request, serving.engine, add, stream=body.stream, started_at=started_at, build=build
    )
