"""`GenerationSpec`: what a dialect asks the generation service for, in neutral terms.

Every frontend (OpenAI chat and completions, Ollama, native; HTTP, SSE, WebSocket, gRPC)
translates its request body into one `GenerationSpec` and nothing more: the prompts (chat
messages for the template, text, or token ids), how many choices, how to sample, the
token limit and what happens when the context cannot hold it, the priority, the output
constraint and the tools. Planning it (template, tokens, constraints, tools, choices)
is the service's (planner.py). Nothing here touches a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferflux.api.images import ImageSet
from inferflux.api.structured import GrammarSyntax
from inferflux.api.tools import ToolPlan
from inferflux.engine.messages import Priority, SamplingParams


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """Messages for the model's chat template (`{role, content, ...}` as the template
    sees them). `tools`: the functions the model may call (None: none; tool calls and
    results in the history still render). `context_token_ids` come before the rendered
    text (Ollama's `context`); BOS is added unless they are there or the text starts with
    it."""

    messages: list[dict[str, object]]
    tools: ToolPlan | None = None
    context_token_ids: list[int] = field(default_factory=list)
    # the last message is an assistant turn to continue (Anthropic's prefill), not a
    # finished one: no generation prompt, and the text ends where its content ends
    continue_final: bool = False
    # the images of the messages; each stands in a message's text as `images.marker`
    images: ImageSet | None = None


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """Text to continue, without a template. `add_special`: add BOS (None: unless the
    text starts with it or follows `context_token_ids`)."""

    text: str
    add_special: bool | None = None
    context_token_ids: list[int] = field(default_factory=list)
    # the images of the text; each stands in it as `images.marker`
    images: ImageSet | None = None


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    """Token ids to continue, checked against the vocabulary."""

    token_ids: list[int]


Prompt = ChatPrompt | TextPrompt | TokenPrompt


@dataclass(frozen=True, slots=True)
class JsonOutput:
    """The output must be JSON valid under `schema` (None: any JSON object)."""

    schema: object | None
    param: str  # the request field it came from, for 400s


@dataclass(frozen=True, slots=True)
class GrammarOutput:
    """The output must match a grammar (GBNF, Lark or a regex)."""

    text: str
    syntax: GrammarSyntax
    param: str


OutputSpec = JsonOutput | GrammarOutput

# A request's sampling once its token limit is resolved against the context.
SamplingFor = Callable[[int], SamplingParams]


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """One request, as any dialect asks for it.

    `sampling(max_tokens)` gives the request's sampling; the service sets each choice's
    seed (the first choice keeps it, the others derive their own) and the compiled
    constraint. `max_tokens` None means "what the context leaves"; with
    `clamp_max_tokens` a limit the context cannot hold is lowered to what it leaves
    (Ollama), otherwise it is a 400 (OpenAI). `id_prefix` starts the response id;
    `prompt_param` names the prompt's field in errors. `stream` False: the client reads
    the whole answer at the end, so the worker sends its tokens in chunks
    (`AddRequest.hold_s`).
    """

    id_prefix: str
    prompts: Sequence[Prompt]
    sampling: SamplingFor
    prompt_param: str
    n: int = 1
    max_tokens: int | None = None
    clamp_max_tokens: bool = False
    priority: Priority = Priority.NORMAL
    output: OutputSpec | None = None
    stream: bool = True
