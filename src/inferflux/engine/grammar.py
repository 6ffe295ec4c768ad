"""Constrained decoding with llguidance: constraints → grammars (API), grammars → matchers (worker).

Owns:
- `ConstraintCompiler` (API process): turns a JSON schema, "any JSON object", GBNF, Lark or
  a regex into an llguidance grammar, under size and nesting limits, validated against the
  served vocabulary. It fails closed: a constraint that cannot be compiled or enforced is
  an `InvalidRequest` (400) naming the problem; nothing ever runs unconstrained instead
  (peers do: llama.cpp issues 19051 and 24097). Results are cached by input.
- `MatcherFactory` / `GrammarMatcher` (worker): one llguidance matcher per constrained
  sequence, made by copying a cached, already compiled matcher of the same grammar.

Does not own: the vocabulary (the llama.cpp backend builds the `llguidance.LLTokenizer`
from it), or sampling (the backend asks the matcher whether a sampled token is allowed,
and masks the logits only when it is not).

Why llguidance: it computes a token mask for a 262k vocabulary in well under a
millisecond and checks one token in microseconds, where llama.cpp's GBNF sampler costs
24–33 ms per token there (docs/engine-notes.md). xgrammar, the other candidate, needs torch,
transformers and triton at install time, gigabytes for a CPU server.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llguidance import LLMatcher, LLParserLimits, LLTokenizer
from llguidance.gbnf_to_lark import any_to_lark

from inferflux.config.settings import Settings
from inferflux.errors import ConstraintFailed, EngineError, InvalidRequest

# How JSON is laid out under a schema: compact with one space after ':' and ',' (what the
# models write naturally), and no free whitespace, which tiny models otherwise emit
# until max_tokens. `lenient` off: a keyword llguidance cannot enforce is an error.
_JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": False,
}
_MAX_ERROR_CHARS = 600
_CACHE_SIZE = 256


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    """Bounds on what a request may ask the engine to enforce (config `structured_output`)."""

    max_schema_bytes: int = 64 * 1024
    max_schema_depth: int = 32
    max_grammar_chars: int = 64 * 1024
    # llguidance's own budget for a grammar (symbols in productions) and per-step work
    max_grammar_size: int = 200_000
    step_max_items: int = 50_000

    def parser_limits(self) -> LLParserLimits:
        """llguidance's limits; verbose errors off (they echo parser state into logs)."""
        return LLParserLimits(
            max_grammar_size=self.max_grammar_size,
            step_max_items=self.step_max_items,
            verbose_errors=False,
        )


def grammar_limits(settings: Settings) -> GrammarLimits:
    """The limits `settings.structured_output` sets."""
    so = settings.structured_output
    return GrammarLimits(
        max_schema_bytes=so.max_schema_bytes,
        max_schema_depth=so.max_schema_depth,
        max_grammar_chars=so.max_grammar_chars,
        max_grammar_size=so.max_grammar_size,
    )


# The worker is the safety net behind the API's checks: it accepts any grammar the API
# could have validated under the largest configurable limits.
WORKER_LIMITS = GrammarLimits(max_grammar_size=10_000_000)


def json_depth(value: object) -> int:
    """Nesting depth of a JSON value (a scalar is 0), without recursion."""
    depth = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            depth = max(depth, level + 1)
            stack.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            depth = max(depth, level + 1)
            stack.extend((child, level + 1) for child in item)
    return depth


def _short(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= _MAX_ERROR_CHARS else message[:_MAX_ERROR_CHARS] + "…"


# Validates an llguidance grammar against the served vocabulary: None, or why not.
Validator = Callable[[str], str | None]


class ConstraintCompiler:
    """Request constraints → validated llguidance grammars. Thread-safe; results cached.

    Every method returns a grammar the worker's `MatcherFactory` accepts, or raises
    InvalidRequest (400) naming `param`. Compiling a large grammar can take up to a few
    hundred ms: call cache misses off the event loop.
    """

    def __init__(self, validate: Validator, limits: GrammarLimits | None = None) -> None:
        self._validate = validate
        self.limits = limits or GrammarLimits()
        self._cache: OrderedDict[tuple[str, str], str | InvalidRequest] = OrderedDict()
        self._lock = threading.Lock()

    def json_schema(self, schema: object, *, param: str) -> str:
        """A grammar for JSON documents valid under `schema` (a JSON Schema object)."""
        text = self.check_schema_bounds(schema, param)
        return self._compile("json", text, param, _schema_grammar)

    def check_schema_bounds(self, schema: object, param: str) -> str:
        """`schema` as compact JSON text, if it is an object within the depth and size
        limits; raises InvalidRequest. Depth is checked first and without recursion, so a
        hostile schema cannot exhaust the stack here or in a recursive validator later."""
        if not isinstance(schema, dict):
            raise InvalidRequest("the JSON schema must be an object", param=param)
        depth = json_depth(schema)
        if depth > self.limits.max_schema_depth:
            raise InvalidRequest(
                f"the JSON schema nests {depth} levels deep; at most "
                f"{self.limits.max_schema_depth} are allowed (structured_output.max_schema_depth)",
                param=param,
            )
        text = json.dumps(schema, separators=(",", ":"))  # NOTE: key order is output order
        size = len(text.encode())
        if size > self.limits.max_schema_bytes:
            raise InvalidRequest(
                f"the JSON schema is {size} bytes; at most {self.limits.max_schema_bytes} are "
                "allowed (structured_output.max_schema_bytes)",
                param=param,
            )
        return text

    def json_object(self, *, param: str) -> str:
        """A grammar for any JSON object (OpenAI's `json_object`, Ollama's `"json"`)."""
        return self.json_schema({"type": "object"}, param=param)

    def gbnf(self, text: str, *, param: str) -> str:
        """A grammar from GBNF (llama.cpp's grammar syntax, root rule `root`)."""
        self._check_text(text, "grammar", param)
        return self._compile("gbnf", text, param, _gbnf_grammar)

    def lark(self, text: str, *, param: str) -> str:
        """A grammar from llguidance's Lark syntax (may embed `%json {...}` schemas)."""
        self._check_text(text, "grammar", param)
        return self._compile("lark", text, param, LLMatcher.grammar_from_lark)

    def regex(self, text: str, *, param: str) -> str:
        """A grammar whose outputs match the regular expression `text` (Rust syntax)."""
        self._check_text(text, "regex", param)
        return self._compile("regex", text, param, LLMatcher.grammar_from_regex)

    def _check_text(self, text: str, what: str, param: str) -> None:
        if not text.strip():
            raise InvalidRequest(f"the {what} is empty", param=param)
        if len(text) > self.limits.max_grammar_chars:
            raise InvalidRequest(
                f"the {what} is {len(text)} characters; at most "
                f"{self.limits.max_grammar_chars} are allowed "
                "(structured_output.max_grammar_chars)",
                param=param,
            )

    def _compile(self, kind: str, text: str, param: str, build: Callable[[str], str]) -> str:
        key = (kind, text)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
        if cached is None:
            cached = self._build(kind, text, build)
            with self._lock:
                self._cache[key] = cached
                while len(self._cache) > _CACHE_SIZE:
                    self._cache.popitem(last=False)
        if isinstance(cached, InvalidRequest):
            raise InvalidRequest(cached.message, param=param)
        return cached

    def _build(self, kind: str, text: str, build: Callable[[str], str]) -> str | InvalidRequest:
        what = {"json": "JSON schema", "regex": "regex"}.get(kind, "grammar")
        try:
            grammar = build(text)
        except (ValueError, RecursionError) as exc:
            return InvalidRequest(f"invalid {what}: {_short(str(exc))}")
        try:
            problem = self._validate(grammar)
        except BaseException as exc:  # NOTE: a Rust panic arrives as pyo3's PanicException
            if type(exc).__name__ != "PanicException":
                raise
            problem = f"the grammar checker failed on it ({_short(str(exc))})"
        if problem:
            return InvalidRequest(f"the {what} cannot be enforced: {_short(problem)}")
        return grammar


def _schema_grammar(text: str) -> str:
    return LLMatcher.grammar_from_json_schema(text, overrides=_JSON_OPTIONS)  # type: ignore[arg-type]


def _gbnf_grammar(text: str) -> str:
    try:
        lark = any_to_lark(text)
    except Exception as exc:  # NOTE: the converter raises assorted errors on bad input
        raise ValueError(f"not valid GBNF ({_short(str(exc)) or type(exc).__name__})") from None
    return LLMatcher.grammar_from_lark(lark)


def validate_grammar(grammar: str, tokenizer: LLTokenizer, limits: GrammarLimits) -> str | None:
    """None when llguidance compiles `grammar` for `tokenizer` within `limits` and can take
    its first token within the per-step limits, else why not."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=limits.parser_limits()
    )
    if is_error:
        return messages[0]
    return _first_step_error(grammar, tokenizer, limits)


def _first_step_error(grammar: str, tokenizer: LLTokenizer, limits: GrammarLimits) -> str | None:
    """Why the grammar's first step fails (llguidance finds some limits only then: a
    repetition like `"a"{100000}` exceeds the parser items of one step, `(a{1000}){1000}`
    the lexer's), or None. Costs one mask and one token: under a millisecond for the
    grammars people write, up to about a second for a hostile one, off the event loop
    (the worker would otherwise spend it, and then fail the request)."""
    parser_limits = limits.parser_limits()
    matcher = LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits)
    if not matcher.is_error():
        mask = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.uint32)
        matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        allowed = np.flatnonzero(mask)
        if not matcher.is_error() and allowed.size:
            word = int(allowed[0])
            bit = (int(mask[word]) & -int(mask[word])).bit_length() - 1
            matcher.consume_token(word * 32 + bit)
    if not matcher.is_error():
        return None
    error = matcher.get_error().replace("<non-verbose/>", "").strip()
    return (
        f"{error} (the engine's limits for one step: "
        f"{parser_limits.step_max_items} parser items, {parser_limits.max_lexer_states} "
        "lexer states)"
    )


class GrammarMatcher:
    """The constraint state of one sequence. Not thread-safe: the worker thread only."""

    def __init__(self, matcher: LLMatcher) -> None:
        self._matcher = matcher

    def allows(self, token: int) -> bool:
        """True when `token` may come next (checks one token: microseconds)."""
        return bool(self._matcher.validate_tokens([token]) == 1)

    def fill_mask(self, words: np.ndarray) -> None:
        """Write the allowed-token bitmask (bit t of 32-bit word t // 32) into `words`."""
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        self._raise_if_failed()

    def consume(self, token: int) -> None:
        """Advance past `token`; raises EngineError if the grammar does not allow it."""
        if not self._matcher.consume_token(token):
            self._raise_if_failed()
            raise EngineError(f"the constraint rejected token {token}")

    @property
    def complete(self) -> bool:
        """True when the grammar admits no further token (the output is finished)."""
        return bool(self._matcher.is_stopped())

    def _raise_if_failed(self) -> None:
        if self._matcher.is_error():
            error = _short(self._matcher.get_error().replace("<non-verbose/>", ""))
            raise ConstraintFailed(f"the output constraint failed: {error}")


class MatcherFactory:
    """Makes `GrammarMatcher`s for one vocabulary; compiled grammars are cached (LRU).

    Worker thread only. `make` raises ValueError for a grammar llguidance rejects.
    """

    def __init__(self, tokenizer: LLTokenizer, limits: GrammarLimits | None = None) -> None:
        self._tokenizer = tokenizer
        self._limits = (limits or WORKER_LIMITS).parser_limits()
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()

    def make(self, grammar: str) -> GrammarMatcher:
        pristine = self._compiled.get(grammar)
        if pristine is None:
            pristine = LLMatcher(self._tokenizer, grammar, log_level=0, limits=self._limits)
            if pristine.is_error():
                raise ValueError(f"invalid constraint: {_short(pristine.get_error())}")
            self._compiled[grammar] = pristine
            while len(self._compiled) > _CACHE_SIZE // 4:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return GrammarMatcher(pristine.deep_copy())
