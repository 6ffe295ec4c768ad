"""POST /v1/completions: prompt(s) (text or token ids) as a `GenerationSpec`, n choices
each, run by the generation service and rendered as `text_completion` JSON or SSE.

Owns the `text_completion` choice shapes (`CompletionChoice`), including `echo` (the
prompt's text, and with `logprobs` the prompt's token logprobs, first one null), and the
completion spec. Validation lives in `protocol.py` and `compat.py`, the response in
`render.py`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferflux.api.deps import json_body
from inferflux.api.generation import (
    ChoiceOpened,
    ChoiceResult,
    Generation,
    GenerationService,
    GenerationSpec,
    Part,
    Prompt,
    Renderer,
    TextPrompt,
    TokenEntry,
    TokenPrompt,
    answer_model,
    respond,
    text_of,
)
from inferflux.api.model_lease import serving_for
from inferflux.api.openai.compat import reject_unsupported
from inferflux.api.openai.logprobs import CompletionLogprobs
from inferflux.api.openai.protocol import CompletionRequest
from inferflux.api.openai.render import (
    Decorate,
    OpenAIRenderer,
    finish_reason_of,
    undecorated,
)
from inferflux.api.state import ContextDep, GenerationDep
from inferflux.models.serving import ServingState
from inferflux.security.context import RequestContext

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

    def piece(self, parts: list[Part], entries: list[TokenEntry]) -> list[dict[str, object]]:
        return [self._choice(text_of(parts), entries, None)]

    def finish(self, parts: list[Part], result: ChoiceResult) -> list[dict[str, object]]:
        finish_reason = finish_reason_of(result)
        return [{"text": "", "index": self.index, "logprobs": None, "finish_reason": finish_reason}]

    def final(self, result: ChoiceResult) -> dict[str, object]:
        text, entries = result.text, result.logprobs
        if self.echo is not None:
            text, entries = self.echo + text, self.echo_entries + entries
        return self._choice(text, entries, finish_reason_of(result))


def _prompt(prompt: str | list[int]) -> Prompt:
    return TextPrompt(prompt, add_special=True) if isinstance(prompt, str) else TokenPrompt(prompt)


def completion_spec(body: CompletionRequest) -> GenerationSpec:
    """The request in the service's terms (several prompts, n choices each)."""
    return body.generation_spec("cmpl", [_prompt(p) for p in body.prompt_inputs()], "prompt")


CompletionBody = Annotated[CompletionRequest, Depends(json_body(CompletionRequest))]
CompletionServing = Annotated[ServingState, Depends(serving_for(CompletionRequest))]


@router.post("/v1/completions")
async def create_completion(
    request: Request,
    body: CompletionBody,
    serving: CompletionServing,
    context: ContextDep,
    generation: GenerationDep,
) -> Response:
    """OpenAI (legacy) text completions: several prompts, n choices each, streaming or not."""
    return await text_completion(request, body, serving, context, generation)


async def text_completion(
    request: Request,
    body: CompletionRequest,
    serving: ServingState,
    context: RequestContext,
    generation: GenerationService,
    decorate: Decorate = undecorated,
) -> Response:
    """The text completion `body` asks for, rendered by `decorate` over the OpenAI
    renderer (the LM Studio routes add their `stats`)."""
    model = answer_model(body.model, serving.model_info, context.caller)
    reject_unsupported(body)
    prompts = body.prompt_inputs()
    logprobs = body.logprobs is not None

    def choice(opened: ChoiceOpened) -> CompletionChoice:
        index = opened.choice.index
        if not body.echo:
            return CompletionChoice(index, logprobs=logprobs)
        prompt = prompts[opened.choice.prompt_index]
        echo = prompt if isinstance(prompt, str) else serving.tokenizer.detokenize(prompt)
        entries = opened.prompt_logprobs if logprobs else None
        return CompletionChoice(index, logprobs=logprobs, echo=echo, echo_entries=entries)

    def renderer_for(started: Generation) -> Renderer:
        names = ("text_completion", "text_completion")
        fingerprint, usage = serving.system_fingerprint, body.include_usage()
        return decorate(
            started,
            OpenAIRenderer.of(started, model, fingerprint, names, include_usage=usage, make=choice),
        )

    start = generation.start(serving, completion_spec(body), context)
    return await respond(request, start, renderer_for, stream=bool(body.stream))
