"""The internal routes the gRPC bridge calls: `POST /grpc/inferflux.v1.Inference/<Method>`.

Owns the four methods' routes and their specs. Each route reads its request message
from the body (`protocol.py`), leases the model it names, and answers with frames
(`render.py`): Generate and Chat run through the generation service like every dialect
(a `GenerationSpec`, `respond(..., stream=True)`), Embed and ListModels reuse the
embedding path and the model listing. They sit behind the whole middleware stack like
every route (authentication, the router's scope, rate limits, audit, the body-size limit),
and answer 404 to anything but the bridge (`GRPC_SCOPE_KEY` in the ASGI scope's
extensions), so they are no second HTTP API.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Depends, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from inferflux.api.generation import (
    CLIENT_CLOSED_REQUEST,
    ChatPrompt,
    Generation,
    GenerationService,
    GenerationSpec,
    TextPrompt,
    answer_model,
    embed_or_disconnect,
    respond,
)
from inferflux.api.generation.embedding import token_lists_of
from inferflux.api.grpc.gen import inference_pb2 as pb
from inferflux.api.grpc.protocol import (
    ChatBody,
    EmbedBody,
    GenerateBody,
    chat_body,
    decode,
    embed_body,
    generate_body,
)
from inferflux.api.grpc.render import GRPC_MEDIA_TYPE, StreamRenderer, message_frame
from inferflux.api.model_cards import may_see
from inferflux.api.model_lease import lease_for
from inferflux.api.state import ContextDep, GenerationDep, ModelsDep
from inferflux.models.serving import ServingState
from inferflux.security.context import RequestContext

SERVICE = "inferflux.v1.Inference"
PATH_PREFIX = f"/grpc/{SERVICE}"
GRPC_SCOPE_KEY = "inferflux.grpc"  # scope["extensions"][GRPC_SCOPE_KEY]: the bridge's call

BodyT = TypeVar("BodyT")


async def bridged_only(request: Request) -> None:
    """404, as for a route that does not exist, unless the gRPC bridge made the call."""
    if GRPC_SCOPE_KEY not in (request.scope.get("extensions") or {}):
        raise HTTPException(404)


router = APIRouter(
    prefix=PATH_PREFIX, include_in_schema=False, dependencies=[Depends(bridged_only)]
)
# ListModels needs the `read` scope only: a router of its own (api/app.py `_ROUTERS`)
models_router = APIRouter(
    prefix=PATH_PREFIX, include_in_schema=False, dependencies=[Depends(bridged_only)]
)


@functools.cache
def grpc_body(read: Callable[[bytes], BodyT]) -> Callable[[Request], Awaitable[BodyT]]:
    """The dependency that reads the body with `read` (one instance per reader, so the
    route and its lease share one parse)."""

    async def body(request: Request) -> BodyT:
        return read(await request.body())

    return body


def _generate(raw: bytes) -> GenerateBody:
    return generate_body(decode(pb.GenerateRequest, raw))


def _chat(raw: bytes) -> ChatBody:
    return chat_body(decode(pb.ChatRequest, raw))


def _embed(raw: bytes) -> EmbedBody:
    return embed_body(decode(pb.EmbedRequest, raw))


def serving_for(read: Callable[[bytes], object]) -> Callable[..., AsyncIterator[ServingState]]:
    """The lease of the model the message `read` decodes names (empty: the default model),
    as every route leases one (`api/model_lease.lease_for`)."""
    return lease_for(grpc_body(read), listing="ListModels lists the models")


GenerateServing = Annotated[ServingState, Depends(serving_for(_generate))]
GenerateRequestBody = Annotated[GenerateBody, Depends(grpc_body(_generate))]
ChatServing = Annotated[ServingState, Depends(serving_for(_chat))]
ChatRequestBody = Annotated[ChatBody, Depends(grpc_body(_chat))]
EmbedServing = Annotated[ServingState, Depends(serving_for(_embed))]
EmbedRequestBody = Annotated[EmbedBody, Depends(grpc_body(_embed))]


def generate_spec(body: GenerateBody) -> GenerationSpec:
    sampling = body.sampling
    return GenerationSpec(
        id_prefix="gen",
        prompts=[TextPrompt(body.prompt, add_special=True)],
        sampling=sampling.sampling_params,
        prompt_param="prompt",
        max_tokens=sampling.max_tokens,
        priority=sampling.priority,
        output=sampling.output_spec(),
    )


def chat_spec(body: ChatBody) -> GenerationSpec:
    sampling = body.sampling
    messages: list[dict[str, object]] = [m.model_dump() for m in body.messages]
    return GenerationSpec(
        id_prefix="chat",
        prompts=[ChatPrompt(messages)],
        sampling=sampling.sampling_params,
        prompt_param="messages",
        max_tokens=sampling.max_tokens,
        priority=sampling.priority,
        output=sampling.output_spec(),
    )


async def _streamed(
    request: Request,
    serving: ServingState,
    context: RequestContext,
    generation: GenerationService,
    model: str,
    spec: GenerationSpec,
    message: type[pb.GenerateResponse] | type[pb.ChatResponse],
) -> Response:
    """Run `spec` and stream its `message`s (Generate and Chat differ in nothing else)."""

    def renderer_for(started: Generation) -> StreamRenderer:
        return StreamRenderer(started, model, message)

    start = generation.start(serving, spec, context)
    return await respond(request, start, renderer_for, stream=True)


@router.post("/Generate")
async def generate(
    request: Request,
    body: GenerateRequestBody,
    serving: GenerateServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Continue a prompt; streams `GenerateResponse` messages."""
    model = answer_model(body.model, serving.model_info, context.caller)
    spec = generate_spec(body)
    return await _streamed(request, serving, context, generation, model, spec, pb.GenerateResponse)


@router.post("/Chat")
async def chat(
    request: Request,
    body: ChatRequestBody,
    serving: ChatServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Answer a conversation; streams `ChatResponse` messages."""
    model = answer_model(body.model, serving.model_info, context.caller)
    return await _streamed(
        request, serving, context, generation, model, chat_spec(body), pb.ChatResponse
    )


@router.post("/Embed")
async def embed(
    request: Request,
    body: EmbedRequestBody,
    serving: EmbedServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """One vector per input, as /v1/embeddings computes them."""
    info = serving.model_info
    model = answer_model(body.model, info, context.caller)
    token_lists = await token_lists_of(body.inputs, serving.tokenizer, info.n_vocab, info.n_ctx)
    result = await embed_or_disconnect(request, generation, serving, token_lists, context)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    embeddings = [pb.Embedding(values=vector) for vector in result.vectors]
    answer = pb.EmbedResponse(
        model=model, embeddings=embeddings, prompt_tokens=result.num_prompt_tokens
    )
    return Response(message_frame(answer), media_type=GRPC_MEDIA_TYPE)


@models_router.post("/ListModels")
async def list_models(request: Request, models: ModelsDep, context: ContextDep) -> Response:
    """Every registered model the caller may use (`allowed_models`), the default first."""
    decode(pb.ListModelsRequest, await request.body())
    views = [v for v in models.models() if v.listed() and may_see(v, context.caller)]
    answer = pb.ListModelsResponse(
        models=[
            pb.Model(
                id=view.model_id,
                aliases=list(view.aliases),
                loaded=view.info is not None,
                is_default=view.is_default,
                vision=view.vision,
            )
            for view in views
        ]
    )
    return Response(message_frame(answer), media_type=GRPC_MEDIA_TYPE)
