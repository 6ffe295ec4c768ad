"""POST /v1/chat/completions: the request as a `GenerationSpec` (messages for the chat
template, n choices, tools, the output constraint), run by the generation service, and
each choice rendered as a `chat.completion` (JSON) or `chat.completion.chunk`s (SSE).

Owns the plain chat choice shape (`ChatChoice`) and the chat spec (`chat_spec`).
Validation lives in `protocol.py` and `compat.py`, the response in `render.py`, tool
calls (their resolution and choice shape) in `chat_tools.py` over `api/tools/`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import (
    ChatPrompt,
    ChoiceOpened,
    ChoiceResult,
    Generation,
    GenerationService,
    GenerationSpec,
    Part,
    Renderer,
    TokenEntry,
    answer_model,
    respond,
    text_of,
)
from inferflux.api.images import ImageSet
from inferflux.api.model_lease import serving_for
from inferflux.api.openai.chat_tools import ToolChatChoice, resolve_chat_tools
from inferflux.api.openai.compat import reject_unsupported
from inferflux.api.openai.envelope import chat_chunk_choice
from inferflux.api.openai.logprobs import chat_logprobs
from inferflux.api.openai.protocol import ChatCompletionRequest
from inferflux.api.openai.render import (
    ChoiceRenderer,
    Decorate,
    OpenAIRenderer,
    finish_reason_of,
    undecorated,
)
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.models.serving import ServingState
from inferflux.security.context import RequestContext

router = APIRouter(tags=["openai"])


class ChatChoice:
    """One `chat.completion` choice and its `chat.completion.chunk` deltas."""

    def __init__(self, index: int, *, logprobs: bool) -> None:
        self.index = index
        self.logprobs = logprobs

    def _chunk(
        self, delta: dict[str, object], finish_reason: str | None, logprobs: object = None
    ) -> dict[str, object]:
        return chat_chunk_choice(self.index, delta, finish_reason, logprobs)

    def opening(self) -> dict[str, object] | None:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def piece(self, parts: list[Part], entries: list[TokenEntry]) -> list[dict[str, object]]:
        logprobs = chat_logprobs(entries) if self.logprobs else None
        return [self._chunk({"content": text_of(parts)}, None, logprobs)]

    def finish(self, parts: list[Part], result: ChoiceResult) -> list[dict[str, object]]:
        return [self._chunk({}, finish_reason_of(result))]

    def final(self, result: ChoiceResult) -> dict[str, object]:
        return {
            "index": self.index,
            "message": {"role": "assistant", "content": result.text, "refusal": None},
            "logprobs": chat_logprobs(result.logprobs) if self.logprobs else None,
            "finish_reason": finish_reason_of(result),
        }


def chat_spec(body: ChatCompletionRequest, serving: ServingState) -> GenerationSpec:
    """The request in the service's terms. Raises InvalidRequest for bad tools (their
    parameter schemas held to the `structured_output.*` bounds) and a bad constraint."""
    tools = resolve_chat_tools(body, serving.constraints)
    images = ImageSet()
    messages = body.template_messages(images)
    return body.generation_spec(
        "chatcmpl", [ChatPrompt(messages, tools, images=images or None)], "messages"
    )


ChatBody = Annotated[ChatCompletionRequest, Depends(json_body(ChatCompletionRequest))]
ChatServing = Annotated[ServingState, Depends(serving_for(ChatCompletionRequest))]


@router.post("/v1/chat/completions")
async def create_chat_completion(
    request: Request,
    body: ChatBody,
    serving: ChatServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """OpenAI chat completions (n choices), streaming (SSE) or not."""
    return await chat_completion(request, body, serving, context, generation)


async def chat_completion(
    request: Request,
    body: ChatCompletionRequest,
    serving: ServingState,
    context: RequestContext,
    generation: GenerationService,
    decorate: Decorate = undecorated,
) -> Response:
    """The chat completion `body` asks for, rendered by `decorate` over the OpenAI
    renderer (the LM Studio routes add their `stats`)."""
    model = answer_model(body.model, serving.model_info, context.caller)
    reject_unsupported(body)
    spec = chat_spec(body, serving)
    logprobs = bool(body.logprobs)

    def renderer_for(started: Generation) -> Renderer:
        names = ("chat.completion", "chat.completion.chunk")
        fingerprint, usage = serving.system_fingerprint, body.include_usage()

        def choice(opened: ChoiceOpened) -> ChoiceRenderer:
            index = opened.choice.index
            if not started.plan.calls_tools:
                return ChatChoice(index, logprobs=logprobs)
            return ToolChatChoice(index, logprobs=logprobs)

        return decorate(
            started,
            OpenAIRenderer.of(started, model, fingerprint, names, include_usage=usage, make=choice),
        )

    start = generation.start(serving, spec, context)
    return await respond(request, start, renderer_for, stream=bool(body.stream))
