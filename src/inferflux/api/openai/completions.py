"""POST /v1/completions: prompt (text or token ids) → engine → OpenAI JSON or SSE.

Owns the `text_completion` response and chunk shapes. Validation lives in `protocol.py`
and the engine round trip in `generation.py`.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from inferflux.api.deps import CompletionBody, ServingDep
from inferflux.api.openai.generation import (
    Completed,
    Usage,
    build_request,
    check_model,
    check_token_ids,
    respond,
    tokenize,
)
from inferflux.api.openai.protocol import reject_unsupported
from inferflux.api.sse import sse_data

router = APIRouter(tags=["openai"])


class CompletionChunks:
    """Builds the `text_completion` body and its streamed chunks for one request."""

    def __init__(
        self, request_id: str, model: str, system_fingerprint: str, *, include_usage: bool
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.system_fingerprint = system_fingerprint
        self.include_usage = include_usage
        self.created = int(time.time())

    def _body(self, choices: list[dict[str, object]]) -> dict[str, object]:
        return {
            "id": self.request_id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        }

    def _chunk(self, text: str, finish_reason: str | None) -> bytes:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        chunk = self._body([choice])
        if self.include_usage:
            chunk["usage"] = None
        return sse_data(chunk)

    def opening(self) -> bytes | None:
        return None

    def text(self, text: str) -> bytes:
        return self._chunk(text, None)

    def finish(self, finish_reason: str) -> bytes:
        return self._chunk("", finish_reason)

    def usage(self, usage: Usage) -> bytes:
        chunk = self._body([])
        chunk["usage"] = usage.as_dict()
        return sse_data(chunk)

    def response(self, completed: Completed) -> dict[str, object]:
        choice = {
            "text": completed.text,
            "index": 0,
            "logprobs": None,
            "finish_reason": completed.finish_reason,
        }
        body = self._body([choice])
        body["usage"] = completed.usage.as_dict()
        return body


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
