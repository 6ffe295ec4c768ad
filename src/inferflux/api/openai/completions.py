"""POST /v1/completions: prompt(s) (text or token ids) → n engine requests each → OpenAI
JSON or SSE.

Owns the `text_completion` choice shapes (`CompletionChoice`), including `echo` (the
prompt's text, and with `logprobs` the prompt's token logprobs, first one null).
Validation lives in `protocol.py` and `compat.py`, the n-choice round trip in
`responder.py`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import CompletionBody, ServingState
from inferflux.api.model_router import serving_for
from inferflux.api.openai.compat import reject_unsupported
from inferflux.api.openai.envelope import ChunkEnvelope
from inferflux.api.openai.generation import (
    check_model,
    check_token_ids,
    output_constraint,
    tokenize,
)
from inferflux.api.openai.logprobs import (
    CompletionLogprobs,
    TokenEntry,
    TokenTexts,
    prompt_entries,
)
from inferflux.api.openai.protocol import CompletionRequest
from inferflux.api.openai.responder import Choice, Responder, build_choices
from inferflux.engine.messages import RequestDelta
from inferflux.engine.protocol import Tokenizer

router = APIRouter(tags=["openai"])


class CompletionChoice:
    """One `text_completion` choice, whole or as streamed chunks.

    `echo`: the prompt's text, sent first; `echo_entries`: its logprob entries.
    """

    def __init__(
        self,
        index: int,
        *,
        logprobs: bool,
        echo: str | None = None,
        echo_entries: list[TokenEntry] | None = None,
    ) -> None:
        self.index = index
        self.echo = echo
        self.echo_entries = echo_entries or []
        self.logprobs = CompletionLogprobs() if logprobs else None

    def _choice(
        self, text: str, entries: list[TokenEntry], finish_reason: str | None
    ) -> dict[str, object]:
        logprobs = self.logprobs.render(entries) if self.logprobs is not None else None
        return {
            "text": text,
            "index": self.index,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }

    def opening(self) -> dict[str, object] | None:
        if self.echo is None:
            return None
        return self._choice(self.echo, self.echo_entries, None)

    def piece(self, text: str, entries: list[TokenEntry]) -> list[dict[str, object]]:
        return [self._choice(text, entries, None)]

    def finish(self, finish_reason: str) -> list[dict[str, object]]:
        return [{"text": "", "index": self.index, "logprobs": None, "finish_reason": finish_reason}]

    def final(self, text: str, entries: list[TokenEntry], finish_reason: str) -> dict[str, object]:
        if self.echo is not None:
            text, entries = self.echo + text, self.echo_entries + entries
        return self._choice(text, entries, finish_reason)


async def _prompt_ids(tokenizer: Tokenizer, prompt: str | list[int], n_vocab: int) -> list[int]:
    if isinstance(prompt, str):
        return await tokenize(tokenizer, prompt, add_special=True)
    check_token_ids(prompt, n_vocab, "prompt")
    return prompt


CompletionServing = Annotated[ServingState, Depends(serving_for(CompletionRequest))]


@router.post("/v1/completions")
async def create_completion(
    request: Request, body: CompletionBody, serving: CompletionServing
) -> Response:
    """OpenAI (legacy) text completions: several prompts, n choices each, streaming or not."""
    model = check_model(body.model, serving.model_info)
    reject_unsupported(body)
    output = await output_constraint(body, serving.constraints)
    prompts = body.prompt_inputs()
    n_vocab = serving.model_info.n_vocab
    prompt_ids = [await _prompt_ids(serving.tokenizer, p, n_vocab) for p in prompts]
    response_id, choices = build_choices(
        "cmpl", body, prompt_ids, serving.model_info, "prompt", output.grammar if output else None
    )
    envelope = ChunkEnvelope(
        response_id,
        model,
        serving.system_fingerprint,
        object_names=("text_completion", "text_completion"),
        include_usage=body.include_usage(),
    )
    texts = TokenTexts(serving.tokenizer)

    def make_renderer(choice: Choice, first: RequestDelta) -> CompletionChoice:
        logprobs = body.logprobs is not None
        if not body.echo:
            return CompletionChoice(choice.index, logprobs=logprobs)
        prompt = prompts[choice.prompt_index]
        ids = choice.add.prompt_token_ids
        echo = prompt if isinstance(prompt, str) else serving.tokenizer.detokenize(prompt)
        entries = prompt_entries(texts, ids, first) if logprobs else None
        return CompletionChoice(choice.index, logprobs=logprobs, echo=echo, echo_entries=entries)

    responder = Responder(envelope, choices, texts, make_renderer, output)
    return await responder.respond(request, serving.engine, stream=bool(body.stream))
