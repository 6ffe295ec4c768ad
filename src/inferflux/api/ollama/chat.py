"""POST /api/chat: messages → chat template → engine → NDJSON lines or one object.

Owns the chat object shape (`message: {role: "assistant", content}`). Messages (roles
system, user, assistant, tool) render through the model's chat template
(`engine/chat_template.py`). Refused with a 400: `tools` and messages with `tool_calls`
(not supported yet), `images` (text-only models). `format` ("json" or a JSON schema)
constrains the output (`protocol.format_constraint`). An empty `messages` list is
Ollama's load request (`done_reason` "load", or "unload" with `keep_alive: 0`; the model
stays resident either way).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import ServingDep, json_body
from inferflux.api.ollama.generate import load_response
from inferflux.api.ollama.models import resolve_model
from inferflux.api.ollama.protocol import OllamaChatRequest, format_constraint
from inferflux.api.ollama.responder import (
    Progress,
    build_request,
    created_at,
    json_response,
    respond,
)
from inferflux.api.openai.generation import tokenize_chat

router = APIRouter(tags=["ollama"])
ChatBody = Annotated[OllamaChatRequest, Depends(json_body(OllamaChatRequest))]


class ChatShape:
    """`/api/chat` objects for one request."""

    def __init__(self, model: str) -> None:
        self.model = model

    def _message(self, text: str) -> dict[str, object]:
        return {"role": "assistant", "content": text}

    def piece(self, text: str) -> dict[str, object]:
        return {
            "model": self.model,
            "created_at": created_at(),
            "message": self._message(text),
            "done": False,
        }

    def final(self, text: str, progress: Progress) -> dict[str, object]:
        return {
            "model": self.model,
            "created_at": created_at(),
            "message": self._message(text),
            **progress.done_fields(),
            **progress.metrics(),
        }


@router.post("/api/chat")
async def chat(request: Request, body: ChatBody, serving: ServingDep) -> Response:
    """Ollama's chat: NDJSON unless `stream` is false."""
    progress = Progress(started_ns=time.monotonic_ns())
    model = resolve_model(body.model, serving.model_info)
    messages = body.template_messages()
    output = await format_constraint(body.format, serving.constraints)
    if not messages:
        return json_response(load_response(model, body.keep_alive_s(), message=True))
    token_ids = await tokenize_chat(serving.tokenizer, serving.chat_template, messages)
    add = build_request(
        "ollama-chat",
        body,
        token_ids,
        serving.model_info,
        "messages",
        output.grammar if output else None,
    )
    return await respond(request, serving, add, ChatShape(model), progress, stream=body.streaming())
