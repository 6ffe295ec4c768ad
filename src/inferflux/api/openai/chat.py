"""POST /v1/chat/completions: messages → chat template → tokens → n engine requests →
OpenAI JSON or SSE.

Owns the plain chat choice shape (`ChatChoice`). Validation lives in `protocol.py` and
`compat.py`, the n-choice round trip in `responder.py`, template rendering in
`engine/chat_template.py`, and tool calling (prompt, grammar, `tool_calls` shapes) in
`chat_tools.py` over `api/tools/`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import ChatBody, ServingState
from inferflux.api.model_router import serving_for
from inferflux.api.openai.chat_tools import ToolChatChoice, plan_chat_tools
from inferflux.api.openai.compat import reject_unsupported
from inferflux.api.openai.envelope import ChunkEnvelope, chat_chunk_choice
from inferflux.api.openai.generation import check_model, output_constraint, tokenize_chat
from inferflux.api.openai.logprobs import TokenEntry, TokenTexts, chat_logprobs
from inferflux.api.openai.protocol import ChatCompletionRequest
from inferflux.api.openai.responder import Choice, ChoiceRenderer, Responder, build_choices
from inferflux.api.tools import tools_constraint
from inferflux.engine.messages import RequestDelta

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

    def piece(self, text: str, entries: list[TokenEntry]) -> list[dict[str, object]]:
        logprobs = chat_logprobs(entries) if self.logprobs else None
        return [self._chunk({"content": text}, None, logprobs)]

    def finish(self, finish_reason: str) -> list[dict[str, object]]:
        return [self._chunk({}, finish_reason)]

    def final(self, text: str, entries: list[TokenEntry], finish_reason: str) -> dict[str, object]:
        return {
            "index": self.index,
            "message": {"role": "assistant", "content": text, "refusal": None},
            "logprobs": chat_logprobs(entries) if self.logprobs else None,
            "finish_reason": finish_reason,
        }


ChatServing = Annotated[ServingState, Depends(serving_for(ChatCompletionRequest))]


@router.post("/v1/chat/completions")
async def create_chat_completion(
    request: Request, body: ChatBody, serving: ChatServing
) -> Response:
    """OpenAI chat completions (n choices), streaming (SSE) or not."""
    model = check_model(body.model, serving.model_info)
    reject_unsupported(body)
    tools = plan_chat_tools(body, serving.chat_template, serving.tokenizer, serving.constraints)
    output = await output_constraint(body, serving.constraints)
    if tools.plan is not None:
        output = await tools_constraint(tools, output, serving.constraints)
    token_ids = await tokenize_chat(
        serving.tokenizer, serving.chat_template, tools.messages, tools=tools.template_tools
    )
    response_id, choices = build_choices(
        "chatcmpl",
        body,
        [token_ids],
        serving.model_info,
        "messages",
        output.grammar if output else None,
    )
    envelope = ChunkEnvelope(
        response_id,
        model,
        serving.system_fingerprint,
        object_names=("chat.completion", "chat.completion.chunk"),
        include_usage=body.include_usage(),
    )

    def make_renderer(choice: Choice, first: RequestDelta) -> ChoiceRenderer:
        logprobs = bool(body.logprobs)
        if tools.plan is None:
            return ChatChoice(choice.index, logprobs=logprobs)
        return ToolChatChoice(
            choice.index, logprobs=logprobs, tool_format=tools.tool_format, plan=tools.plan
        )

    responder = Responder(envelope, choices, TokenTexts(serving.tokenizer), make_renderer, output)
    return await responder.respond(request, serving.engine, stream=bool(body.stream))
