"""POST /tokenize and POST /detokenize, in vLLM's shapes, with the served model's vocabulary.

`/tokenize` takes a `prompt` (tokenized as /v1/completions does: BOS added) or chat
`messages` (rendered and tokenized exactly as /v1/chat/completions does, so `count`
equals that route's `usage.prompt_tokens`). `/detokenize` turns ids back into text and
refuses ids outside the vocabulary.
"""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends

from inferflux.api.deps import json_body
from inferflux.api.generation import (
    TokenTexts,
    answer_model,
    check_token_ids,
    tokenize,
    tokenize_chat,
)
from inferflux.api.model_lease import serving_for
from inferflux.api.openai.protocol import DetokenizeRequest, TokenizeRequest, template_messages
from inferflux.api.state import ContextDep
from inferflux.api.tools import detect_tool_format, prepare_messages
from inferflux.models.serving import ServingState

router = APIRouter(tags=["tokenizer"])

_THREAD_DETOKENIZE_TOKENS = 8_192  # longer id lists are detokenized off the event loop

TokenizeBody = Annotated[TokenizeRequest, Depends(json_body(TokenizeRequest))]
DetokenizeBody = Annotated[DetokenizeRequest, Depends(json_body(DetokenizeRequest))]


TokenizeServing = Annotated[ServingState, Depends(serving_for(TokenizeRequest))]

DetokenizeServing = Annotated[ServingState, Depends(serving_for(DetokenizeRequest))]


@router.post("/tokenize")
async def tokenize_text(
    body: TokenizeBody, serving: TokenizeServing, context: ContextDep
) -> dict[str, object]:
    """Token ids of a prompt or of chat messages, their count and the context size."""
    answer_model(body.model, serving.model_info, context.caller)
    add_special = body.add_special_override()
    if body.prompt is not None:
        token_ids = await tokenize(
            serving.tokenizer, body.prompt, add_special=True if add_special is None else add_special
        )
    else:
        # tool history renders as in a chat request without tools (api/tools/prompt.py)
        tool_format = detect_tool_format(
            serving.chat_template.source, is_fallback=serving.chat_template.is_fallback
        )
        messages, _ = prepare_messages(template_messages(body.messages or []), tool_format, None)
        token_ids = await tokenize_chat(
            serving.tokenizer,
            serving.chat_template,
            messages,
            add_generation_prompt=body.add_generation_prompt,
            add_special=add_special,
        )
    token_strs = None
    if body.return_token_strs:
        texts = TokenTexts(serving.tokenizer)
        token_strs = [texts(token_id).text for token_id in token_ids]
    return {
        "count": len(token_ids),
        "max_model_len": serving.model_info.n_ctx,
        "tokens": token_ids,
        "token_strs": token_strs,
    }


@router.post("/detokenize")
async def detokenize_tokens(
    body: DetokenizeBody, serving: DetokenizeServing, context: ContextDep
) -> dict[str, object]:
    """The text of token ids (special tokens render as empty); 400 for unknown ids."""
    answer_model(body.model, serving.model_info, context.caller)
    check_token_ids(body.tokens, serving.model_info.n_vocab, "tokens")
    if len(body.tokens) > _THREAD_DETOKENIZE_TOKENS:
        text = await anyio.to_thread.run_sync(serving.tokenizer.detokenize, body.tokens)
    else:
        text = serving.tokenizer.detokenize(body.tokens)
    return {"prompt": text}
