"""POST /api/generate: a prompt (templated, or `raw`) → engine → NDJSON lines or one object.

Owns: the generate prompt (system + prompt through the chat template, or the raw text,
after any `context` token ids), the generate object shape (`response`, and `context` on
the last object: the prompt's token ids followed by every generated token id, so a client
can continue from it), and the load/unload answers for an empty prompt.

Refused with a 400: `images` (text-only models), `suffix` (no fill-in-the-middle),
`template` (Ollama's Go templates; InferFlux renders the model's Jinja chat template).
`format` ("json" or a JSON schema) constrains the output (`protocol.format_constraint`).
`think` is ignored.
`keep_alive` sets how long the model stays loaded once idle (`0`: unload as soon as this
request ends; negative: forever); the default model is never unloaded.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import ServingState, json_body
from inferflux.api.model_router import ModelRouter, ModelsDep, serving_for
from inferflux.api.ollama.models import resolve_model
from inferflux.api.ollama.protocol import OllamaGenerateRequest, format_constraint
from inferflux.api.ollama.responder import (
    Progress,
    build_request,
    created_at,
    json_response,
    respond,
)
from inferflux.api.openai.generation import check_token_ids, tokenize
from inferflux.errors import InvalidRequest

router = APIRouter(tags=["ollama"])
GenerateBody = Annotated[OllamaGenerateRequest, Depends(json_body(OllamaGenerateRequest))]


class GenerateShape:
    """`/api/generate` objects for one request."""

    def __init__(self, model: str, prompt_token_ids: list[int]) -> None:
        self.model = model
        self.prompt_token_ids = prompt_token_ids

    def piece(self, text: str) -> dict[str, object]:
        return {"model": self.model, "created_at": created_at(), "response": text, "done": False}

    def final(self, text: str, progress: Progress) -> dict[str, object]:
        return {
            "model": self.model,
            "created_at": created_at(),
            "response": text,
            **progress.done_fields(),
            "context": self.prompt_token_ids + progress.output_token_ids,
            **progress.metrics(),
        }


def load_response(model: str, keep_alive_s: float | None, message: bool) -> dict[str, object]:
    """Ollama's answer to a request with nothing to generate: `done_reason` "load", or
    "unload" for `keep_alive: 0` (the model unloads once idle unless it is the default)."""
    body: dict[str, object] = {"model": model, "created_at": created_at()}
    if message:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body["done"] = True
    body["done_reason"] = "unload" if keep_alive_s == 0 else "load"
    return body


def keep_alive(models: ModelRouter, serving: ServingState, seconds: float | None) -> None:
    """Apply a request's `keep_alive` (seconds; None: the model keeps its deadline)."""
    if seconds is not None:
        models.keep_alive(serving.model_info.model_id, seconds)


def check_supported(body: OllamaGenerateRequest) -> None:
    """400 for the generate parameters InferFlux cannot honour (module docstring)."""
    if body.images:
        raise InvalidRequest("images are not supported: this model reads text only", param="images")
    if body.suffix:
        raise InvalidRequest("suffix (fill-in-the-middle) is not supported", param="suffix")
    if body.template:
        raise InvalidRequest(
            "template is not supported: InferFlux renders the model's chat template; send "
            "raw=true with a fully formatted prompt instead",
            param="template",
        )


async def prompt_token_ids(body: OllamaGenerateRequest, serving: ServingState) -> list[int]:
    """`context` (checked against the vocabulary) followed by the new prompt's tokens.
    BOS is added only when there is no context and the text does not start with it."""
    context = list(body.context or [])
    check_token_ids(context, serving.model_info.n_vocab, "context")
    text = body.prompt or ""
    if not body.raw:
        messages: list[dict[str, object]] = []
        if body.system:
            messages.append({"role": "system", "content": body.system})
        messages.append({"role": "user", "content": text})
        text = serving.chat_template.render(messages)
    bos = serving.tokenizer.bos_text
    add_special = not context and not (bos and text.startswith(bos))
    return context + await tokenize(serving.tokenizer, text, add_special=add_special)


GenerateServing = Annotated[ServingState, Depends(serving_for(OllamaGenerateRequest))]


@router.post("/api/generate")
async def generate(
    request: Request, body: GenerateBody, serving: GenerateServing, models: ModelsDep
) -> Response:
    """Ollama's generate: NDJSON unless `stream` is false."""
    progress = Progress(started_ns=time.monotonic_ns())
    model = resolve_model(body.model, serving.model_info)
    keep_alive(models, serving, body.keep_alive_s())
    check_supported(body)
    output = await format_constraint(body.format, serving.constraints)
    if not body.prompt:
        return json_response(load_response(model, body.keep_alive_s(), message=False))
    token_ids = await prompt_token_ids(body, serving)
    add = build_request(
        "ollama-gen",
        body,
        token_ids,
        serving.model_info,
        "prompt",
        output.grammar if output else None,
    )
    shape = GenerateShape(model, token_ids)
    return await respond(request, serving, add, shape, progress, stream=body.streaming())
