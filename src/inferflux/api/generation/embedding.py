"""Embedding inputs, as every dialect takes them: a string, strings, token ids, or lists
of token ids, turned into the token lists to embed with the checks that need the model
(vocabulary, context length, the per-request limits).

Vectors are the mean of the model's last hidden states over the input's tokens,
L2-normalized; `GenerationService.embed` runs them.
"""

from __future__ import annotations

import anyio

from inferflux.api.generation.planner import check_token_ids
from inferflux.engine.protocol import Tokenizer
from inferflux.errors import ContextLengthExceeded, InvalidRequest

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
MAX_TOTAL_TOKENS = 300_000  # OpenAI's limit on tokens per request, over all inputs
_THREAD_TOKENIZE_CHARS = 16_384  # more text than this is tokenized off the event loop

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


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
