"""POST /api/chat: messages → the generation service → NDJSON lines or one object.

Owns the chat object shape (`message: {role: "assistant", content, tool_calls}`).
Messages (roles system, user, assistant, tool) render through the model's chat template.
With `tools`, the model may call them (`api/tools/`): calls come back as
`message.tool_calls: [{id, function: {index, name, arguments: {...}}}]`, streamed as one
line per completed call, never as `<tool_call>` text (the service parses them). `format`
("json" or a JSON schema) constrains the output (`protocol.format_output`); with `tools`
it is a 400. A user message's `images` (base64) stand before its text (api/images: a
model without an mmproj answers 400, as do malformed and oversized images). An empty
`messages` list is Ollama's load request (`done_reason` "load", or "unload" with
`keep_alive: 0`: the model unloads once idle unless it is the default).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import ChatPrompt, ChoiceResult, Part, Timings, respond
from inferflux.api.images import ImageSet
from inferflux.api.model_lease import serving_for
from inferflux.api.ollama.generate import keep_alive, load_response, ollama_spec
from inferflux.api.ollama.models import resolve_model
from inferflux.api.ollama.protocol import OllamaChatRequest
from inferflux.api.ollama.render import (
    OllamaRenderer,
    created_at,
    done_fields,
    json_response,
    metrics_of,
)
from inferflux.api.state import ContextDep, GenerationDep, ModelsDep
from inferflux.api.tools import ToolCall
from inferflux.models.serving import ServingState

router = APIRouter(tags=["ollama"])
ChatBody = Annotated[OllamaChatRequest, Depends(json_body(OllamaChatRequest))]


class ChatShape:
    """`/api/chat` objects for one request; parts hold text and the tool calls the service
    parsed (held while text may be a call)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.num_calls = 0

    def _message(self, parts: list[Part]) -> dict[str, object]:
        text = "".join(p for p in parts if isinstance(p, str))
        message: dict[str, object] = {"role": "assistant", "content": text}
        calls = [p for p in parts if isinstance(p, ToolCall)]
        if calls:
            message["tool_calls"] = [self._call(call) for call in calls]
        return message

    def _call(self, call: ToolCall) -> dict[str, object]:
        index, self.num_calls = self.num_calls, self.num_calls + 1
        function = {"index": index, "name": call.name, "arguments": call.arguments_object()}
        return {"id": call.id, "function": function}

    def piece(self, parts: list[Part]) -> dict[str, object] | None:
        if not parts:
            return None
        return {
            "model": self.model,
            "created_at": created_at(),
            "message": self._message(parts),
            "done": False,
        }

    def final(self, parts: list[Part], result: ChoiceResult, timings: Timings) -> dict[str, object]:
        return {
            "model": self.model,
            "created_at": created_at(),
            "message": self._message(parts),
            **done_fields(result),
            **metrics_of(result, timings),
        }


ChatServing = Annotated[ServingState, Depends(serving_for(OllamaChatRequest))]


def with_system(messages: list[dict[str, object]], system: str | None) -> list[dict[str, object]]:
    """The model's system prompt (`ollama create --system`) first, when the conversation
    has messages and no system message of its own."""
    if not system or not messages or any(m.get("role") == "system" for m in messages):
        return messages
    return [{"role": "system", "content": system}, *messages]


@router.post("/api/chat")
async def chat(
    request: Request,
    body: ChatBody,
    serving: ChatServing,
    models: ModelsDep,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Ollama's chat: NDJSON unless `stream` is false."""
    model = resolve_model(body.model, serving.model_info, context.caller)
    keep_alive(models, serving, body.keep_alive_s())
    images = ImageSet()
    messages = with_system(body.template_messages(images), serving.system)
    tools = body.tool_plan(serving.constraints.check_schema_bounds)
    prompt = ChatPrompt(messages, tools, images=images or None)
    spec = ollama_spec("ollama-chat", body, prompt, serving, "messages")
    if not messages:
        return json_response(load_response(model, body.keep_alive_s(), message=True))
    renderer = OllamaRenderer(ChatShape(model), logprobs=body.num_logprobs() is not None)
    start = generation.start(serving, spec, context)
    return await respond(request, start, lambda _: renderer, stream=body.streaming())
