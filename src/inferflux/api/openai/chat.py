"""POST /v1/chat/completions: messages → chat template → tokens → engine → OpenAI JSON or SSE.

Owns the chat response and chunk shapes. Validation lives in `protocol.py`, the engine
round trip in `generation.py`, and template rendering in `engine/chat_template.py`.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from inferflux.api.deps import ChatBody, ServingDep
from inferflux.api.openai.generation import (
    Completed,
    Usage,
    build_request,
    check_model,
    respond,
    tokenize,
)
from inferflux.api.openai.protocol import reject_unsupported
from inferflux.api.sse import sse_data

router = APIRouter(tags=["openai"])


class ChatChunks:
    """Builds the `chat.completion` body and `chat.completion.chunk` events of one request."""

    def __init__(
        self, request_id: str, model: str, system_fingerprint: str, *, include_usage: bool
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.system_fingerprint = system_fingerprint
        self.include_usage = include_usage
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, object]]) -> bytes:
        chunk: dict[str, object] = {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None
        return sse_data(chunk)

    def _choice(
        self, delta: dict[str, object], finish_reason: str | None
    ) -> list[dict[str, object]]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]

    def opening(self) -> bytes | None:
        return self._chunk(self._choice({"role": "assistant", "content": ""}, None))

    def text(self, text: str) -> bytes:
        return self._chunk(self._choice({"content": text}, None))

    def finish(self, finish_reason: str) -> bytes:
        return self._chunk(self._choice({}, finish_reason))

    def usage(self, usage: Usage) -> bytes:
        return sse_data(
            {
                "id": self.request_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": self.system_fingerprint,
                "choices": [],
                "usage": usage.as_dict(),
            }
        )

    def response(self, completed: Completed) -> dict[str, object]:
        message = {"role": "assistant", "content": completed.text, "refusal": None}
        return {
            "id": self.request_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": completed.finish_reason,
                }
            ],
            "usage": completed.usage.as_dict(),
        }


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request, body: ChatBody, serving: ServingDep) -> Response:
    """OpenAI chat completions, streaming (SSE) or not."""
    model = check_model(body.model, serving.model_info)
    reject_unsupported(body)
    text = serving.chat_template.render(body.template_messages())
    bos = serving.tokenizer.bos_text
    add_special = not (bos and text.startswith(bos))
    token_ids = await tokenize(serving.tokenizer, text, add_special=add_special)
    add = build_request("chatcmpl", body, token_ids, serving.model_info, "messages")
    chunks = ChatChunks(
        add.request_id, model, serving.system_fingerprint, include_usage=body.include_usage()
    )
    return await respond(
        request,
        serving.engine,
        add,
        chunks,
        stream=bool(body.stream),
        include_usage=body.include_usage(),
        build=chunks.response,
    )
