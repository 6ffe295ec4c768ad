"""POST /api/chat: messages → chat template → engine → NDJSON lines or one object.

Owns the chat object shape (`message: {role: "assistant", content, tool_calls}`).
Messages (roles system, user, assistant, tool) render through the model's chat template
(`engine/chat_template.py`). With `tools`, the model may call them (`api/tools/`): calls
come back as `message.tool_calls: [{id, function: {index, name, arguments: {...}}}]`,
streamed as one line per completed call, never as `<tool_call>` text. `format` ("json"
or a JSON schema) constrains the output (`protocol.format_constraint`); with `tools` it
is a 400. Refused with a 400: `images` (text-only models). An empty `messages` list is
Ollama's load request (`done_reason` "load", or "unload" with `keep_alive: 0`: the model
unloads once idle unless it is the default).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import ServingState, json_body
from inferflux.api.model_router import ModelsDep, serving_for
from inferflux.api.ollama.generate import keep_alive, load_response
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
from inferflux.api.tools import ChatTools, ToolCall, ToolCallParser, plan_tools, tools_constraint
from inferflux.api.tools.parser import Event

router = APIRouter(tags=["ollama"])
ChatBody = Annotated[OllamaChatRequest, Depends(json_body(OllamaChatRequest))]


class ChatShape:
    """`/api/chat` objects for one request. With a tool plan, text goes through a
    `ToolCallParser` (held while it may be a call; calls become `tool_calls`)."""

    def __init__(self, model: str, tools: ChatTools | None = None) -> None:
        self.model = model
        self.parser: ToolCallParser | None = None
        if tools is not None and tools.plan is not None:
            self.parser = ToolCallParser(tools.tool_format, tools.plan.names())
        self.num_calls = 0

    def _message(self, events: list[Event]) -> dict[str, object]:
        text = "".join(e for e in events if isinstance(e, str))
        message: dict[str, object] = {"role": "assistant", "content": text}
        calls = [e for e in events if isinstance(e, ToolCall)]
        if calls:
            message["tool_calls"] = [self._call(call) for call in calls]
        return message

    def _call(self, call: ToolCall) -> dict[str, object]:
        index, self.num_calls = self.num_calls, self.num_calls + 1
        function = {"index": index, "name": call.name, "arguments": call.arguments_object()}
        return {"id": call.id, "function": function}

    def piece(self, text: str) -> dict[str, object] | None:
        events: list[Event] = [text] if self.parser is None else self.parser.push(text)
        if not events:
            return None
        return {
            "model": self.model,
            "created_at": created_at(),
            "message": self._message(events),
            "done": False,
        }

    def final(self, text: str, progress: Progress) -> dict[str, object]:
        events: list[Event] = [text]
        if self.parser is not None:
            events = self.parser.push(text) + self.parser.finish()
        return {
            "model": self.model,
            "created_at": created_at(),
            "message": self._message(events),
            **progress.done_fields(),
            **progress.metrics(),
        }


ChatServing = Annotated[ServingState, Depends(serving_for(OllamaChatRequest))]


@router.post("/api/chat")
async def chat(
    request: Request, body: ChatBody, serving: ChatServing, models: ModelsDep
) -> Response:
    """Ollama's chat: NDJSON unless `stream` is false."""
    progress = Progress(started_ns=time.monotonic_ns())
    model = resolve_model(body.model, serving.model_info)
    keep_alive(models, serving, body.keep_alive_s())
    messages = body.template_messages()
    output = await format_constraint(body.format, serving.constraints)
    plan = body.tool_plan(serving.constraints.check_schema_bounds)
    if not messages:
        return json_response(load_response(model, body.keep_alive_s(), message=True))
    tools = plan_tools(messages, plan, serving.chat_template, serving.tokenizer)
    if plan is not None:
        output = await tools_constraint(tools, output, serving.constraints)
    token_ids = await tokenize_chat(
        serving.tokenizer, serving.chat_template, tools.messages, tools=tools.template_tools
    )
    constraint = output.grammar if output else None
    add = build_request("ollama-chat", body, token_ids, serving.model_info, "messages", constraint)
    shape = ChatShape(model, tools)
    return await respond(request, serving, add, shape, progress, stream=body.streaming())
