"""POST /v1/chat/completions: messages → chat template → tokens → engine → OpenAI JSON or SSE.

Owns the chat response and chunk shapes. Validation lives in `protocol.py`, the engine
round trip in `generation.py`, and template rendering in `engine/chat_template.py`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from inferflux.api.deps import ChatBody, ServingDep
from inferflux.api.openai.generation import (
    ChunkEnvelope,
    Completed,
    build_request,
    check_model,
    respond,
    tokenize,
)
from inferflux.api.openai.protocol import reject_unsupported

router = APIRouter(tags=["openai"])


class ChatChunks(ChunkEnvelope):
    """Builds the `chat.completion` body and `chat.completion.chunk` events of one request."""

    chunk_object = "chat.completion.chunk"
    response_object = "chat.completion"

    def _delta(self, delta: dict[str, object], finish_reason: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self.chunk([choice])

    def opening(self) -> bytes | None:
        return self._delta({"role": "assistant", "content": ""}, None)

    def text(self, text: str) -> bytes:
        return self._delta({"content": text}, None)

    def finish(self, finish_reason: str) -> bytes:
        return self._delta({}, finish_reason)

    def response(self, completed: Completed) -> dict[str, object]:
        message = {"role": "assistant", "content": completed.text, "refusal": None}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": completed.finish_reason,
        }
        return self.full_response(choice, completed.usage)


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
