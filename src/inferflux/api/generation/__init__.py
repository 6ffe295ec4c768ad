"""The dialect-neutral generation service (docs/architecture.md, "A request's path").

A frontend is a protocol module (its request body → `GenerationSpec`) and a renderer
(`GenerationEvent`s → its frames, `GenerationResult` → its body); everything between,
from planning the request to reading the engine's deltas, is here:

- `spec.py`: what a dialect asks for (`GenerationSpec`, prompts, output constraints);
- `planner.py`: template, tokens, constraints, tools, choices → `GenerationPlan`;
- `service.py`: `GenerationService` (plan, submit, embed) and `Generation` (events or the
  collected result), with logprob alignment (`logprobs.py`), tool-call parsing and the
  structured-output check;
- `events.py`: the typed events and results;
- `streams.py`: the engine's delta streams (submit, merge, abort);
- `http.py`: one generation as an HTTP response (`respond`, `Renderer`).
"""

from inferflux.api.generation.events import (
    ChoiceClosed,
    ChoiceOpened,
    ChoiceOutput,
    ChoiceResult,
    GenerationDone,
    GenerationEvent,
    GenerationResult,
    Part,
    StructuredCheck,
    Timings,
    Usage,
    text_of,
)
from inferflux.api.generation.http import (
    CLIENT_CLOSED_REQUEST,
    Renderer,
    embed_or_disconnect,
    respond,
    until_disconnect,
)
from inferflux.api.generation.logprobs import TokenEntry, TokenText, TokenTexts
from inferflux.api.generation.planner import (
    Choice,
    GenerationPlan,
    answer_model,
    check_token_ids,
    tokenize,
    tokenize_chat,
)
from inferflux.api.generation.service import Generation, GenerationService
from inferflux.api.generation.spec import (
    ChatPrompt,
    GenerationSpec,
    GrammarOutput,
    JsonOutput,
    OutputSpec,
    Prompt,
    TextPrompt,
    TokenPrompt,
)
from inferflux.engine.messages import FinishReason, Priority, SamplingParams

__all__ = [
    "CLIENT_CLOSED_REQUEST",
    "ChatPrompt",
    "Choice",
    "ChoiceClosed",
    "ChoiceOpened",
    "ChoiceOutput",
    "ChoiceResult",
    "FinishReason",
    "Generation",
    "GenerationDone",
    "GenerationEvent",
    "GenerationPlan",
    "GenerationResult",
    "GenerationService",
    "GenerationSpec",
    "GrammarOutput",
    "JsonOutput",
    "OutputSpec",
    "Part",
    "Priority",
    "Prompt",
    "Renderer",
    "SamplingParams",
    "StructuredCheck",
    "TextPrompt",
    "Timings",
    "TokenEntry",
    "TokenPrompt",
    "TokenText",
    "TokenTexts",
    "Usage",
    "answer_model",
    "check_token_ids",
    "text_of",
    "embed_or_disconnect",
    "respond",
    "tokenize",
    "tokenize_chat",
    "until_disconnect",
]
