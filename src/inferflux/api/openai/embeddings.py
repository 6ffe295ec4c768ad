"""POST /v1/embeddings: text or token ids → engine → one pooled vector per input (OpenAI shape).

Owns: the OpenAI embeddings request model, the `dimensions` check, and the `list` of
`embedding` objects, as floats or base64 (little-endian float32, as OpenAI encodes it).
Turning `input` into token lists is the generation service's
(`api/generation/embedding.py`), and so is the engine round trip.

Vectors are the mean of the model's last hidden states over the input's tokens,
L2-normalized (docs/engine-notes.md: cos(paraphrase) 0.93 vs cos(unrelated) 0.62 on Gemma
270M).
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import msgspec
import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import CLIENT_CLOSED_REQUEST, answer_model, embed_or_disconnect
from inferflux.api.generation.embedding import MAX_INPUTS, EmbeddingInput, token_lists_of
from inferflux.api.model_lease import serving_for
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.engine.protocol import EmbeddingResult
from inferflux.errors import InvalidRequest
from inferflux.models.serving import ServingState

router = APIRouter(tags=["openai"])


class EmbeddingRequest(BaseModel):
    """Body of POST /v1/embeddings (OpenAI). Strict: no coercion, unknown fields refused."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    input: EmbeddingInput = Field(
        description="a string, an array of strings, an array of token ids, or an array of "
        f"token-id arrays (at most {MAX_INPUTS} inputs)"
    )
    model: str | None = Field(None, description="the served model id; omitted = that model")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float arrays, or base64 of little-endian float32"
    )
    dimensions: int | None = Field(
        None, description="accepted only when equal to the model's embedding size"
    )
    user: str | None = Field(None, description="accepted, ignored")


EmbeddingBody = Annotated[EmbeddingRequest, Depends(json_body(EmbeddingRequest))]


def check_dimensions(dimensions: int | None, n_embd: int) -> None:
    """Vectors are never truncated: `dimensions` must be the model's size (or left out)."""
    if dimensions is not None and dimensions != n_embd:
        raise InvalidRequest(
            f"'dimensions' {dimensions} is not supported: this model's embeddings have "
            f"{n_embd} dimensions; send {n_embd} or leave it out",
            param="dimensions",
        )


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def embedding_list(result: EmbeddingResult, model: str, encoding_format: str) -> dict[str, object]:
    """OpenAI's `list` of `embedding` objects with usage."""
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, encoding_format)}
        for i, v in enumerate(result.vectors)
    ]
    tokens = result.num_prompt_tokens
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


EmbeddingServing = Annotated[ServingState, Depends(serving_for(EmbeddingRequest))]


@router.post("/v1/embeddings")
async def create_embeddings(
    request: Request,
    body: EmbeddingBody,
    serving: EmbeddingServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """One vector per input: the mean of the model's hidden states, L2-normalized."""
    info = serving.model_info
    model = answer_model(body.model, info, context.caller)
    check_dimensions(body.dimensions, info.n_embd)
    token_lists = await token_lists_of(body.input, serving.tokenizer, info.n_vocab, info.n_ctx)
    result = await embed_or_disconnect(request, generation, serving, token_lists, context)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    body_out = embedding_list(result, model, body.encoding_format)
    return Response(msgspec.json.encode(body_out), media_type="application/json")
