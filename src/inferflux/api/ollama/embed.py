"""POST /api/embed and the legacy POST /api/embeddings, over `EngineClient.embed`.

Owns the two Ollama embedding shapes. `/api/embed` takes one string or a list, returns
L2-normalized vectors (`embeddings`) with `total_duration`, `load_duration` and
`prompt_eval_count`; inputs longer than the context are cut to it unless `truncate` is
false (then 400); `dimensions` keeps the first N components and normalizes again, as
Ollama does. `/api/embeddings` takes one `prompt` and returns the raw (not normalized)
vector as `embedding`, as Ollama does. An empty input gives an empty result (Ollama's
load request).
"""

from __future__ import annotations

import math
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import CLIENT_CLOSED_REQUEST, embed_or_disconnect, tokenize
from inferflux.api.model_lease import serving_for
from inferflux.api.ollama.models import resolve_model
from inferflux.api.ollama.protocol import OllamaEmbeddingsRequest, OllamaEmbedRequest
from inferflux.api.ollama.render import json_response
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.errors import InvalidRequest
from inferflux.models.serving import ServingState

router = APIRouter(tags=["ollama"])
EmbedBody = Annotated[OllamaEmbedRequest, Depends(json_body(OllamaEmbedRequest))]
EmbeddingsBody = Annotated[OllamaEmbeddingsRequest, Depends(json_body(OllamaEmbeddingsRequest))]

MAX_EMBED_INPUTS = 2048


def shorten(vector: list[float], dimensions: int | None) -> list[float]:
    """The first `dimensions` components, L2-normalized again (None: `vector` as is)."""
    if dimensions is None:
        return vector
    head = vector[:dimensions]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head


async def embed_token_ids(
    texts: list[str], serving: ServingState, *, truncate: bool, param: str
) -> list[list[int]]:
    """Token ids of each input (BOS as the model wants it), checked against the context:
    cut to it when `truncate`, else InvalidRequest."""
    n_ctx = serving.model_info.n_ctx
    inputs = []
    for index, text in enumerate(texts):
        name = param if len(texts) == 1 else f"{param}[{index}]"
        token_ids = await tokenize(serving.tokenizer, text, add_special=True)
        if not token_ids:
            raise InvalidRequest("an input to embed must not be empty", param=name)
        if len(token_ids) > n_ctx:
            if not truncate:
                raise InvalidRequest(
                    f"the input length ({len(token_ids)} tokens) exceeds the context length "
                    f"({n_ctx}); shorten it or set truncate=true",
                    param=name,
                )
            token_ids = token_ids[:n_ctx]
        inputs.append(token_ids)
    return inputs


EmbedServing = Annotated[ServingState, Depends(serving_for(OllamaEmbedRequest))]

EmbeddingsServing = Annotated[ServingState, Depends(serving_for(OllamaEmbeddingsRequest))]


@router.post("/api/embed")
async def embed(
    request: Request,
    body: EmbedBody,
    serving: EmbedServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Ollama's embed: normalized vectors for one input or a list."""
    started_ns = time.monotonic_ns()
    model = resolve_model(body.model, serving.model_info, context.caller)
    texts = body.inputs()
    if len(texts) > MAX_EMBED_INPUTS:
        raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
    n_embd = serving.model_info.n_embd
    if body.dimensions is not None and n_embd and body.dimensions > n_embd:
        raise InvalidRequest(
            f"dimensions {body.dimensions} is larger than the model's {n_embd}",
            param="dimensions",
        )
    if not texts or texts == [""]:
        return json_response({"model": model, "embeddings": []})
    inputs = await embed_token_ids(
        texts, serving, truncate=body.truncate is not False, param="input"
    )
    submitted_ns = time.monotonic_ns()
    result = await embed_or_disconnect(request, generation, serving, inputs, context)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return json_response(
        {
            "model": model,
            "embeddings": [shorten(vector, body.dimensions) for vector in result.vectors],
            "total_duration": max(time.monotonic_ns() - started_ns, 1),
            "load_duration": max(submitted_ns - started_ns, 1),
            "prompt_eval_count": result.num_prompt_tokens,
        }
    )


@router.post("/api/embeddings")
async def embeddings(
    request: Request,
    body: EmbeddingsBody,
    serving: EmbeddingsServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """Ollama's legacy embeddings: one prompt, its raw vector."""
    resolve_model(body.model, serving.model_info, context.caller)
    if not body.prompt:
        return json_response({"embedding": []})
    inputs = await embed_token_ids([body.prompt], serving, truncate=True, param="prompt")
    result = await embed_or_disconnect(
        request, generation, serving, inputs, context, normalize=False
    )
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return json_response({"embedding": result.vectors[0]})
