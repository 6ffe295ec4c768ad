"""POST /embeddings (native, spec requirements 1.3 and 11.3): text → one vector per input.

Owns the native request and response models only; tokenizing, checks and the engine round
trip are shared with POST /v1/embeddings (`api/openai/embeddings.py`). The response is
built as `EmbeddingsResponse` and serialized by it, so it parses back into the same model
(spec requirement 11.5).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import CLIENT_CLOSED_REQUEST, answer_model, embed_or_disconnect
from inferflux.api.generation.embedding import MAX_INPUTS, token_lists_of
from inferflux.api.model_lease import serving_for
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.models.serving import ServingState

router = APIRouter(tags=["native"])


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class EmbeddingsRequest(_Strict):
    """Body of POST /embeddings."""

    input: str | list[str] = Field(
        description=f"a text, or an array of at most {MAX_INPUTS} texts (none empty)"
    )
    model: str | None = Field(None, description="the served model id; omitted = that model")


class EmbeddingData(_Strict):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] = Field(description="L2-normalized; the model's n_embd floats")


class EmbeddingsUsage(_Strict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(_Strict):
    """The answer of POST /embeddings: one `data` item per input, in input order."""

    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingsUsage


EmbeddingsBody = Annotated[EmbeddingsRequest, Depends(json_body(EmbeddingsRequest))]


EmbeddingsServing = Annotated[ServingState, Depends(serving_for(EmbeddingsRequest))]


@router.post("/embeddings", responses={200: {"model": EmbeddingsResponse}})
async def embeddings(
    request: Request,
    body: EmbeddingsBody,
    serving: EmbeddingsServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """One vector per input text: the mean of the model's hidden states, L2-normalized."""
    info = serving.model_info
    model = answer_model(body.model, info, context.caller)
    token_lists = await token_lists_of(body.input, serving.tokenizer, info.n_vocab, info.n_ctx)
    result = await embed_or_disconnect(request, generation, serving, token_lists, context)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    tokens, vectors = result.num_prompt_tokens, result.vectors
    # NOTE: model_construct: the engine's floats need no per-item validation
    response = EmbeddingsResponse(
        data=[EmbeddingData.model_construct(index=i, embedding=v) for i, v in enumerate(vectors)],
        model=model,
        usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens),
    )
    return Response(response.model_dump_json(), media_type="application/json")
