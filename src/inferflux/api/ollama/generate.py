"""POST /api/generate: a prompt (templated, or `raw`) → engine → NDJSON lines or one object.

Owns: the generate prompt (system + prompt through the chat template, or the raw text,
after any `context` token ids), the generate object shape (`response`, and `context` on
the last object: the prompt's token ids followed by every generated token id, so a client
can continue from it), and the load/unload answers for an empty prompt.

`images` (base64) stand before the prompt's text (api/images: a model without an mmproj
answers 400). Refused with a 400: `suffix` (no fill-in-the-middle),
`template` (Ollama's Go templates; InferFlux renders the model's Jinja chat template).
`format` ("json" or a JSON schema) constrains the output (`protocol.format_constraint`).
`think` is ignored.
`keep_alive` sets how long the model stays loaded once idle (`0`: unload as soon as this
request ends; negative: forever); the default model is never unloaded.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import (
    ChatPrompt,
    ChoiceResult,
    GenerationSpec,
    Part,
    Prompt,
    SamplingParams,
    TextPrompt,
    Timings,
    respond,
    text_of,
)
from inferflux.api.images import ImageSet
from inferflux.api.model_lease import serving_for
from inferflux.api.ollama.models import resolve_model
from inferflux.api.ollama.protocol import (
    GenerationBody,
    OllamaGenerateRequest,
    format_output,
    requested_max_tokens,
    sampling_params,
    with_images,
    with_model_defaults,
)
from inferflux.api.ollama.render import (
    OllamaRenderer,
    created_at,
    done_fields,
    json_response,
    metrics_of,
)
from inferflux.api.state import ContextDep, GenerationDep, ModelsDep
from inferflux.errors import InvalidRequest
from inferflux.models.protocol import ModelDirectory
from inferflux.models.serving import ServingState

router = APIRouter(tags=["ollama"])
GenerateBody = Annotated[OllamaGenerateRequest, Depends(json_body(OllamaGenerateRequest))]


class GenerateShape:
    """`/api/generate` objects for one request."""

    def __init__(self, model: str) -> None:
        self.model = model

    def piece(self, parts: list[Part]) -> dict[str, object]:
        response = text_of(parts)
        return {
            "model": self.model,
            "created_at": created_at(),
            "response": response,
            "done": False,
        }

    def final(self, parts: list[Part], result: ChoiceResult, timings: Timings) -> dict[str, object]:
        context = result.choice.request.prompt_token_ids + result.output_token_ids
        return {
            "model": self.model,
            "created_at": created_at(),
            "response": text_of(parts),
            **done_fields(result),
            "context": context,
            **metrics_of(result, timings),
        }


def ollama_spec(
    id_prefix: str, body: GenerationBody, prompt: Prompt, serving: ServingState, param: str
) -> GenerationSpec:
    """One choice of `prompt` under Ollama's `options` over the model's default
    `parameters` (a `num_predict` the context cannot hold is lowered to what it leaves,
    as Ollama does) and `format`."""
    n_ctx = serving.model_info.n_ctx
    logprobs = body.num_logprobs()
    options = with_model_defaults(body.options, serving.parameters)

    def sampling(max_tokens: int) -> SamplingParams:
        return sampling_params(options, max_tokens=max_tokens, n_ctx=n_ctx, logprobs=logprobs)

    return GenerationSpec(
        id_prefix=id_prefix,
        prompts=[prompt],
        sampling=sampling,
        prompt_param=param,
        max_tokens=requested_max_tokens(options),
        clamp_max_tokens=True,
        priority=body.engine_priority(),
        output=format_output(body.format),
        stream=body.streaming(),
    )


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


def keep_alive(models: ModelDirectory, serving: ServingState, seconds: float | None) -> None:
    """Apply a request's `keep_alive` (seconds; None: the model keeps its deadline)."""
    if seconds is not None:
        models.keep_alive(serving.model_info.model_id, seconds)


def check_supported(body: OllamaGenerateRequest) -> None:
    """400 for the generate parameters InferFlux cannot honour (module docstring)."""
    if body.suffix:
        raise InvalidRequest("suffix (fill-in-the-middle) is not supported", param="suffix")
    if body.template:
        raise InvalidRequest(
            "template is not supported: InferFlux renders the model's chat template; send "
            "raw=true with a fully formatted prompt instead",
            param="template",
        )


def generate_prompt(body: OllamaGenerateRequest, model_system: str | None = None) -> Prompt:
    """`context` (checked against the vocabulary) followed by the new prompt: the raw
    text, or system (the request's, else the model's `model_system`) + prompt through
    the chat template. BOS is added only when there is no context and the text does not
    start with it."""
    context = list(body.context or [])
    text = body.prompt or ""
    images = ImageSet()
    if body.images:
        text = with_images(text, body.images, "images", images)
    if body.raw:
        return TextPrompt(text, context_token_ids=context, images=images or None)
    messages: list[dict[str, object]] = []
    system = body.system or model_system
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    return ChatPrompt(messages, context_token_ids=context, images=images or None)


GenerateServing = Annotated[ServingState, Depends(serving_for(OllamaGenerateRequest))]


@router.post("/api/generate")
async def generate(
    request: Request,
    body: GenerateBody,
    serving: GenerateServing,
    models: ModelsDep,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Ollama's generate: NDJSON unless `stream` is false."""
    model = resolve_model(body.model, serving.model_info, context.caller)
    keep_alive(models, serving, body.keep_alive_s())
    check_supported(body)
    prompt = generate_prompt(body, serving.system)
    spec = ollama_spec("ollama-gen", body, prompt, serving, "prompt")
    if not body.prompt and not body.images:
        return json_response(load_response(model, body.keep_alive_s(), message=False))
    renderer = OllamaRenderer(GenerateShape(model), logprobs=body.num_logprobs() is not None)
    start = generation.start(serving, spec, context)
    return await respond(request, start, lambda _: renderer, stream=body.streaming())
