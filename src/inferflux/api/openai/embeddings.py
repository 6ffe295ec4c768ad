"""POST /v1/embeddings: text or token ids → engine → one pooled vector per input (OpenAI shape).

Owns: the OpenAI embeddings request model, turning `input` (a string, strings, token ids,
or lists of token ids) into token lists with the checks that need the model (vocabulary,
context length, `dimensions`), the engine round trip, and the `list` of `embedding`
objects, as floats or base64 (little-endian float32, as OpenAI encodes it). The native
`POST /embeddings` (`api/native/embeddings.py`) reuses `token_lists_of` and `run_embed`.

Vectors are the mean of the model's last hidden states over the input's tokens,
L2-normalized (ENGINE_NOTES.md: cos(paraphrase) 0.93 vs cos(unrelated) 0.62 on Gemma 270M).
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

import anyio
import msgspec
import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from inferflux.api.deps import ServingState, json_body
from inferflux.api.model_router import serving_for
from inferflux.api.openai.generation import (
    CLIENT_CLOSED_REQUEST,
    check_model,
    check_token_ids,
    until_disconnect,
)
from inferflux.engine.protocol import EmbeddingResult, Tokenizer
from inferflux.errors import ContextLengthExceeded, InvalidRequest

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
MAX_TOTAL_TOKENS = 300_000  # OpenAI's limit on tokens per request, over all inputs
_THREAD_TOKENIZE_CHARS = 16_384  # more text than this is tokenized off the event loop

router = APIRouter(tags=["openai"])

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


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


def _texts_and_ids(value: EmbeddingInput) -> tuple[list[str], list[list[int]]]:
    """Split `input` into strings to tokenize, or token lists given as they are."""
    if isinstance(value, str):
        return [value], []
    if not value:
        raise InvalidRequest("'input' must not be an empty array", param="input")
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(
            f"'input' has {len(value)} items; at most {MAX_INPUTS} per request", param="input"
        )
    first = value[0]
    if isinstance(first, str):
        return [v for v in value if isinstance(v, str)], []
    if isinstance(first, int):
        return [], [[v for v in value if isinstance(v, int)]]
    return [], [v for v in value if isinstance(v, list)]


def _tokenize_all(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer.tokenize(t, add_special=True, parse_special=True) for t in texts]


async def token_lists_of(
    value: EmbeddingInput, tokenizer: Tokenizer, n_vocab: int, n_ctx: int
) -> list[list[int]]:
    """The token lists to embed for `input`. Raises InvalidRequest (empty input, too many
    inputs or tokens, ids outside the vocabulary) or ContextLengthExceeded."""
    texts, token_lists = _texts_and_ids(value)
    if texts:
        for index, text in enumerate(texts):
            if not text:
                raise InvalidRequest(
                    "'input' must not be or contain an empty string", param=_param(value, index)
                )
        if sum(len(t) for t in texts) > _THREAD_TOKENIZE_CHARS:
            token_lists = await anyio.to_thread.run_sync(_tokenize_all, tokenizer, texts)
        else:
            token_lists = _tokenize_all(tokenizer, texts)
    _check_lengths(value, token_lists, n_ctx)
    for index, token_ids in enumerate(token_lists):
        check_token_ids(token_ids, n_vocab, _param(value, index))
    return token_lists


def _check_lengths(value: EmbeddingInput, token_lists: list[list[int]], n_ctx: int) -> None:
    for index, token_ids in enumerate(token_lists):
        if not token_ids:
            raise InvalidRequest("'input' must not be empty", param=_param(value, index))
        if len(token_ids) > n_ctx:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {n_ctx} tokens, but input {index} "
                f"has {len(token_ids)} tokens; shorten it",
                param=_param(value, index),
            )
    total = sum(len(t) for t in token_lists)
    if total > MAX_TOTAL_TOKENS:
        raise InvalidRequest(
            f"the inputs have {total} tokens in all; at most {MAX_TOTAL_TOKENS} per request",
            param="input",
        )


def _param(value: EmbeddingInput, index: int) -> str:
    """`input[i]` for arrays of inputs, `input` for a single one."""
    single = isinstance(value, str) or (bool(value) and isinstance(value[0], int))
    return "input" if single else f"input[{index}]"


def check_dimensions(dimensions: int | None, n_embd: int) -> None:
    """Vectors are never truncated: `dimensions` must be the model's size (or left out)."""
    if dimensions is not None and dimensions != n_embd:
        raise InvalidRequest(
            f"'dimensions' {dimensions} is not supported: this model's embeddings have "
            f"{n_embd} dimensions; send {n_embd} or leave it out",
            param="dimensions",
        )


async def run_embed(
    request: Request, serving: ServingState, token_lists: list[list[int]]
) -> EmbeddingResult | None:
    """Embed `token_lists` on the engine; None when the client disconnected first (the
    engine then drops the request)."""
    return await until_disconnect(request, serving.engine.embed(token_lists))


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
    request: Request, body: EmbeddingBody, serving: EmbeddingServing
) -> Response:
    """One vector per input: the mean of the model's hidden states, L2-normalized."""
    info = serving.model_info
    model = check_model(body.model, info)
    check_dimensions(body.dimensions, info.n_embd)
    token_lists = await token_lists_of(body.input, serving.tokenizer, info.n_vocab, info.n_ctx)
    result = await run_embed(request, serving, token_lists)
    if result is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    body_out = embedding_list(result, model, body.encoding_format)
    return Response(msgspec.json.encode(body_out), media_type="application/json")
