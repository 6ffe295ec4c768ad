"""What a running generation yields, typed and dialect-neutral, and what it finishes with.

A `Generation` (service.py) yields, in order: one `ChoiceOpened` per choice; then, as the
engine produces them, `ChoiceOutput`s (new text, tool calls, logprob entries) and one
`ChoiceClosed` per choice, choices interleaved; then `GenerationDone` with the usage and
timings. A dialect's renderer turns each into its own frames (an SSE chunk, an NDJSON
line, a WebSocket message), or the whole `GenerationResult` into one body. Parts are
either text or a `ToolCall` the parser read out of the text (the call markup itself is
never a text part).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferflux.api.generation.logprobs import TokenEntry
from inferflux.api.generation.planner import Choice
from inferflux.api.tools import ToolCall
from inferflux.engine.messages import FinishReason

Part = str | ToolCall


def text_of(parts: list[Part]) -> str:
    """The text of `parts` (tool calls left out); one text part is returned as it is."""
    if len(parts) == 1 and isinstance(parts[0], str):
        return parts[0]
    return "".join(p for p in parts if isinstance(p, str))


@dataclass(frozen=True, slots=True)
class StructuredCheck:
    """A finished output checked against its JSON schema (`error` None when valid)."""

    valid: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class ChoiceOpened:
    """A choice started. `prompt_logprobs`: its prompt's entries (first one without a
    logprob) when the request asked for them."""

    choice: Choice
    prompt_logprobs: list[TokenEntry] | None = None


@dataclass(slots=True)  # NOTE: one per streamed token; a frozen init is slower
class ChoiceOutput:
    """Something of choice `index` to show: `parts` (text, or tool calls once whole; empty
    while the parser holds back text that may start a call) and the logprob entries of
    the tokens whose text was released with it. `closing`: it came with the choice's
    last delta (its `ChoiceClosed` follows at once)."""

    index: int
    parts: list[Part]
    logprobs: list[TokenEntry]
    closing: bool = False


@dataclass(slots=True)
class ChoiceResult:
    """A finished choice. `text` and `parts` hold the whole output when it was kept (a
    collected response, or a JSON check); `finish_reason` is the engine's, or ERROR when
    the JSON check failed on an output that was not cut short (`structured`)."""

    choice: Choice
    finish_reason: FinishReason
    num_output_tokens: int
    num_cached_tokens: int
    output_token_ids: list[int]
    num_tool_calls: int = 0
    text: str = ""
    parts: list[Part] = field(default_factory=list)
    logprobs: list[TokenEntry] = field(default_factory=list)
    structured: StructuredCheck | None = None
    stop_sequence: str | None = None  # the stop string that ended it (STOP_SEQUENCE)
    num_draft_tokens: int = 0  # speculative decoding: tokens drafted
    num_draft_accepted: int = 0  # of those, accepted into the output
    # the prompt's tokens as the worker counted them: with images, their tokens too (the
    # API knows only the text's); 0 = not reported
    num_engine_prompt_tokens: int = 0

    @property
    def index(self) -> int:
        return self.choice.index

    @property
    def num_prompt_tokens(self) -> int:
        return max(len(self.choice.request.prompt_token_ids), self.num_engine_prompt_tokens)


@dataclass(frozen=True, slots=True)
class ChoiceClosed:
    """Choice `result.index` finished; `parts` are what the tool-call parser still held."""

    parts: list[Part]
    result: ChoiceResult


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one response. Each prompt counts once, however many choices it got
    (OpenAI's rule; its cached tokens are the fewest any of its choices had); completion
    tokens add up over every choice."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding, over every choice
    draft_accepted_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    """Clock readings of one generation, `time.monotonic_ns()`: started (planning began),
    submitted (the engine got it), first delta (every choice answered), first token (the
    first delta with output), last delta (0 while none came)."""

    started_ns: int
    submitted_ns: int
    first_delta_ns: int
    first_token_ns: int | None
    last_delta_ns: int


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """A finished generation: every choice in index order, the usage and the timings."""

    response_id: str
    choices: list[ChoiceResult]
    usage: Usage
    timings: Timings


@dataclass(frozen=True, slots=True)
class GenerationDone:
    """The last event: every choice finished."""

    result: GenerationResult


GenerationEvent = ChoiceOpened | ChoiceOutput | ChoiceClosed | GenerationDone
