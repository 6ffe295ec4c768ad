"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API.

Owns the routes and the spec of a Messages request (`messages_spec`): the conversation
through the model's chat template (system prompt, tool uses and results as the template
expects them), `tools` / `tool_choice` resolved like every dialect's, one choice, the
token limit checked strictly (a prompt that leaves no room for `max_tokens` is a 400).
Shapes live in `protocol.py`, the message and its events in `render.py`. The credential
comes as `x-api-key` (Anthropic's header) or `Authorization: Bearer`; `anthropic-version`
and `anthropic-beta` are accepted and ignored. Errors use Anthropic's body
(`{"type": "error", "error": {"type", "message"}}`, api/errors.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from inferflux.api.anthropic.render import MessagesRenderer
from inferflux.api.deps import json_body
from inferflux.api.generation import (
    ChatPrompt,
    Generation,
    GenerationSpec,
    answer_model,
    respond,
)
from inferflux.api.images import ImageSet
from inferflux.api.model_lease import serving_for
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.models.serving import ServingState

router = APIRouter(tags=["anthropic"])

MessagesBody = Annotated[MessagesRequest, Depends(json_body(MessagesRequest))]
MessagesServing = Annotated[ServingState, Depends(serving_for(MessagesRequest))]
CountBody = Annotated[CountTokensRequest, Depends(json_body(CountTokensRequest))]
CountServing = Annotated[ServingState, Depends(serving_for(CountTokensRequest))]


def messages_spec(body: MessagesRequest, serving: ServingState) -> GenerationSpec:
    """The request in the service's terms. Raises InvalidRequest for what it cannot
    honour (`check_supported`), bad tools and a bad output schema."""
    body.check_supported()
    tools = body.tool_plan(serving.constraints.check_schema_bounds)
    images = ImageSet()
    messages = body.template_messages(images)
    final = body.continues_final()
    return GenerationSpec(
        id_prefix="msg",
        prompts=[ChatPrompt(messages, tools, continue_final=final, images=images or None)],
        sampling=body.sampling_params,
        prompt_param="messages",
        max_tokens=body.max_tokens,
        priority=body.engine_priority(),
        output=body.output_spec(),
        stream=bool(body.stream),
    )


@router.post("/v1/messages")
async def create_message(
    request: Request,
    body: MessagesBody,
    serving: MessagesServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Anthropic's Messages API: one message, streamed (named SSE events) or not."""
    model = answer_model(body.model, serving.model_info, context.caller)
    spec = messages_spec(body, serving)

    def renderer_for(started: Generation) -> MessagesRenderer:
        return MessagesRenderer(started, model)

    start = generation.start(serving, spec, context)
    return await respond(request, start, renderer_for, stream=bool(body.stream))


@router.post("/v1/messages/count_tokens")
async def count_tokens(
    body: CountBody, serving: CountServing, context: ContextDep, generation: GenerationDep
) -> dict[str, int]:
    """The prompt's tokens as /v1/messages would queue them (template, tools and all);
    nothing is generated. A prompt that fills the model's context is a 400."""
    answer_model(body.model, serving.model_info, context.caller)
    spec = messages_spec(body.as_messages_request(), serving)
    plan = await generation.plan(serving, spec, context)
    return {"input_tokens": len(plan.choices[0].request.prompt_token_ids)}
