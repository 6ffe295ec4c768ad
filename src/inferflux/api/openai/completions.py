"""POST /v1/completions: prompt (text or token ids) → engine → OpenAI JSON or SSE.

Owns the `text_completion` response and chunk shapes. Validation lives in `protocol.py`
and the engine round trip in `generation.py`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from inferflux.api.deps import CompletionBody, ServingDep
from inferflux.api.openai.generation import (
    ChunkEnvelope,
    Completed,
    build_request,
    check_model,
    check_token_ids,
    respond,
    tokenize,
)
from inferflux.api.openai.protocol import reject_unsupported

router = APIRouter(tags=["openai"])


class CompletionChunks(ChunkEnvelope):
    """Builds the `text_completion` body and its streamed chunks for one request."""

    chunk_object = "text_completion"
    response_object = "text_completion"

    def _choice(self, text: str, finish_reason: str | None) -> bytes:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return self.chunk([choice])

    def opening(self) -> bytes | None:
        return None

    def text(self, text: str) -> bytes:
        return self._choice(text, None)

    def finish(self, finish_reason: str) -> bytes:
        return self._choice("", finish_reason)

    def response(self, completed: Completed) -> dict[str, object]:
        choice = {
            "text": completed.text,
            "index": 0,
            "logprobs": None,
            "finish_reason": completed.finish_reason,
        }
        return self.full_response(choice, completed.usage)


@router.post("/v1/completions")
async def create_completion(
    request: Request, body: CompletionBody, serving: ServingDep
) -> Response:
    """OpenAI (legacy) text completions, streaming (SSE) or not."""
    model = check_model(body.model, serving.model_info)
    reject_unsupported(body)
    prompt = body.prompt_input()
    if isinstance(prompt, str):
        token_ids = await tokenize(serving.tokenizer, prompt, add_special=True)
    else:
        check_token_ids(prompt, serving.model_info.n_vocab, "prompt")
        token_ids = prompt
    add = build_request("cmpl", body, token_ids, serving.model_info, "prompt")
    chunks = CompletionChunks(
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
