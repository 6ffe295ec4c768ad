"""POST /v1/responses, GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items:
OpenAI's Responses API over HTTP (its WebSocket mode is `socket.py`).

Owns the spec of a Responses request (`responses_spec`: the stored conversation of
`previous_response_id`, then this request's input, through the model's chat template;
`instructions` as the system prompt, never carried over; tools, `text.format`, one
choice, the token limit checked strictly) and what is kept of a finished response
(`ResponseStore`, per owner: see store.py). A WebSocket connection's own store is looked
up first (`CONNECTION_STORE`), so a chain continues there with `store: false` too.
Shapes live in `protocol.py`, the response and its events in `render.py`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

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
from inferflux.api.response_store import ResponseStore, StoredResponse, owner_of
from inferflux.api.responses.protocol import (
    InputTokensRequest,
    ResponsesRequest,
    item_json,
    stored_items,
    template_messages,
)
from inferflux.api.responses.render import ResponsesRenderer, settings_echo
from inferflux.api.state import ContextDep, GenerationDep, StateDep
from inferflux.errors import InvalidRequest, NotFound
from inferflux.models.serving import ServingState
from inferflux.security.context import RequestContext

router = APIRouter(tags=["responses"])

# scope["extensions"] key of a WebSocket connection's own ResponseStore (socket.py)
CONNECTION_STORE = "inferflux.responses.connection"

ResponsesBody = Annotated[ResponsesRequest, Depends(json_body(ResponsesRequest))]
ResponsesServing = Annotated[ServingState, Depends(serving_for(ResponsesRequest))]
CountBody = Annotated[InputTokensRequest, Depends(json_body(InputTokensRequest))]
CountServing = Annotated[ServingState, Depends(serving_for(InputTokensRequest))]


class PreviousResponseNotFound(InvalidRequest):
    code = "previous_response_not_found"


def _stores(request: Request, store: ResponseStore) -> list[ResponseStore]:
    """Where a response may be found: the connection's own store first, then the app's."""
    own = request.scope.get("extensions", {}).get(CONNECTION_STORE)
    return [own, store] if isinstance(own, ResponseStore) else [store]


def _find(stores: list[ResponseStore], owner: str, response_id: str) -> StoredResponse | None:
    for store in stores:
        found = store.get(owner, response_id)
        if found is not None:
            return found
    return None


def history_of(
    body: ResponsesRequest, stores: list[ResponseStore], owner: str
) -> tuple[dict[str, object], ...]:
    """The conversation `previous_response_id` continues (empty without one)."""
    if body.previous_response_id is None:
        return ()
    previous = _find(stores, owner, body.previous_response_id)
    if previous is None:
        raise PreviousResponseNotFound(
            f"previous response '{body.previous_response_id}' not found (never stored, "
            "expired, deleted, or another tenant's): send the whole conversation as input",
            param="previous_response_id",
        )
    return previous.conversation


def responses_spec(
    body: ResponsesRequest, history: tuple[dict[str, object], ...], serving: ServingState
) -> GenerationSpec:
    """The request in the service's terms. Raises InvalidRequest for what it cannot
    honour (`check_supported`), bad tools and a bad output schema."""
    body.check_supported()
    stored = stored_items(history)
    items = [*stored, *body.checked_input()]
    tools = body.tool_plan(serving.constraints.check_schema_bounds)
    images = ImageSet()
    messages = template_messages(body.instructions, items, images, len(stored))
    return GenerationSpec(
        id_prefix="resp",
        prompts=[ChatPrompt(messages, tools, images=images or None)],
        sampling=body.sampling_params,
        prompt_param="input",
        max_tokens=body.max_output_tokens,
        priority=body.engine_priority(),
        output=body.output_spec(),
        stream=bool(body.stream),
    )


@router.post("/v1/responses")
async def create_response(
    request: Request,
    body: ResponsesBody,
    serving: ResponsesServing,
    context: ContextDep,
    generation: GenerationDep,
    state: StateDep,
) -> Response:
    """A model response, streamed (typed SSE events) or not; kept unless `store: false`."""
    model = answer_model(body.model, serving.model_info, context.caller)
    owner = owner_of(context.caller)
    stores = _stores(request, state.responses)
    history = history_of(body, stores, owner)
    spec = responses_spec(body, history, serving)
    settings = settings_echo(body, model)
    inputs = tuple(item_json(item) for item in body.checked_input())

    def renderer_for(started: Generation) -> ResponsesRenderer:
        def on_finished(response: dict[str, object], output: list[dict[str, object]]) -> None:
            stored = StoredResponse(
                id=renderer.id,
                body=response,
                input_items=inputs,
                conversation=(*history, *inputs, *output),
                num_bytes=len(msgspec.json.encode([response, inputs])),
            )
            for store in stores[:-1]:  # the connection's own store keeps every response
                store.put(owner, stored)
            if body.stores():
                state.responses.put(owner, stored)

        renderer = ResponsesRenderer(started, settings, on_finished)
        return renderer

    start = generation.start(serving, spec, context)
    return await respond(request, start, renderer_for, stream=bool(body.stream))


def _stored(
    request: Request, state: StateDep, context: RequestContext, response_id: str
) -> StoredResponse:
    found = _find(_stores(request, state.responses), owner_of(context.caller), response_id)
    if found is None:
        raise NotFound(f"response '{response_id}' not found", param="response_id")
    return found


@router.get("/v1/responses/{response_id}")
async def get_response(
    request: Request, response_id: str, state: StateDep, context: ContextDep
) -> Response:
    """A stored response, as it was returned."""
    stored = _stored(request, state, context, response_id)
    return Response(msgspec.json.encode(stored.body), media_type="application/json")


@router.delete("/v1/responses/{response_id}")
async def delete_response(
    request: Request, response_id: str, state: StateDep, context: ContextDep
) -> dict[str, object]:
    """Forget a stored response (a chain that continues it then gets a 400)."""
    _stored(request, state, context, response_id)
    owner = owner_of(context.caller)
    for store in _stores(request, state.responses):
        store.delete(owner, response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    request: Request,
    response_id: str,
    state: StateDep,
    context: ContextDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> dict[str, object]:
    """The input items of a stored response (this request's, not its history's)."""
    stored = _stored(request, state, context, response_id)
    items = [_with_id(item, f"{response_id}_in_{n}") for n, item in enumerate(stored.input_items)]
    if order == "desc":
        items.reverse()
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def _with_id(item: dict[str, object], fallback: str) -> dict[str, object]:
    return {**item, "id": item.get("id", fallback)}


@router.post("/v1/responses/input_tokens")
async def count_input_tokens(
    request: Request,
    body: CountBody,
    serving: CountServing,
    context: ContextDep,
    generation: GenerationDep,
    state: StateDep,
) -> dict[str, object]:
    """The prompt's tokens as POST /v1/responses would queue them (history, template,
    tools and all); nothing is generated. A prompt that fills the context is a 400."""
    model = answer_model(body.model, serving.model_info, context.caller)
    full = body.as_request(model)
    history = history_of(full, _stores(request, state.responses), owner_of(context.caller))
    plan = await generation.plan(serving, responses_spec(full, history, serving), context)
    count = len(plan.choices[0].request.prompt_token_ids)
    return {"object": "response.input_tokens", "input_tokens": count}
