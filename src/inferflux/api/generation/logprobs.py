"""Log-probabilities aligned with the text a client actually sees (every dialect).

Owns: turning the engine's per-token `TokenLogprob`s into `TokenEntry`s (token text and
bytes from `Tokenizer.token_bytes`), the prompt's entries (`prompt_entries`), and
releasing each entry only once its text was released (`LogprobAligner`). The dialects
render entries in their own shapes (api/openai/logprobs.py, api/ollama/render.py).

Why align: a delta's `token_ids` may hold a token whose text the engine holds back (it
might start a stop string) and releases in a later delta, or never (it became the stop
string). Entries follow the text: a token's entry is released once the released text
covers all its bytes; at the end, an end-of-generation token (no text) is dropped, and
tokens of a matched stop string are dropped unless some of their bytes were shown.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from inferflux.engine.messages import FinishReason, RequestDelta, TokenLogprob
from inferflux.engine.protocol import Tokenizer
from inferflux.errors import EngineError

_MIN_LOGPROB = -9999.0  # what OpenAI reports for a zero probability (JSON has no -inf)


@dataclass(frozen=True, slots=True)
class TokenText:
    """A token as a client sees it: `text` (invalid UTF-8 replaced) and its raw bytes."""

    text: str
    raw: bytes


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One position: the token there, its logprob (None for a prompt's first token), and
    the most likely alternatives, most likely first."""

    token: TokenText
    logprob: float | None
    top: tuple[tuple[TokenText, float], ...] | None


class TokenTexts:
    """Token id → `TokenText`, memoized (one per request; the tokenizer is thread-safe)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, TokenText] = {}

    def __call__(self, token_id: int) -> TokenText:
        text = self._cache.get(token_id)
        if text is None:
            raw = self._tokenizer.token_bytes(token_id)
            text = self._cache[token_id] = TokenText(raw.decode("utf-8", "replace"), raw)
        return text

    def entry(self, logprob: TokenLogprob) -> TokenEntry:
        top = tuple((self(token_id), _finite(lp)) for token_id, lp in logprob.top)
        return TokenEntry(self(logprob.token_id), _finite(logprob.logprob), top)


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else _MIN_LOGPROB


def prompt_entries(
    texts: TokenTexts, prompt_token_ids: list[int], delta: RequestDelta
) -> list[TokenEntry]:
    """Entries of the prompt (from the first delta's `prompt_logprobs`); the first token
    has no logprob (nothing predicts it), as OpenAI reports it."""
    logprobs = delta.prompt_logprobs
    if logprobs is None or len(logprobs) != len(prompt_token_ids):
        raise EngineError("the engine did not return the prompt's logprobs")
    entries = []
    for token_id, logprob in zip(prompt_token_ids, logprobs, strict=True):
        if logprob is None:
            entries.append(TokenEntry(texts(token_id), None, None))
        else:
            entries.append(texts.entry(logprob))
    return entries


class LogprobAligner:
    """Releases one choice's token entries in step with its released text.

    Feed every delta of the choice, in order, to `push`. Disabled (always returns [])
    when the request asked for no logprobs.
    """

    def __init__(self, texts: TokenTexts, *, enabled: bool) -> None:
        self._texts = texts
        self._enabled = enabled
        self._pending: deque[TokenEntry] = deque()
        self._released = 0  # bytes of released text not yet matched to a token

    def push(self, delta: RequestDelta) -> list[TokenEntry]:
        """The entries whose text is now released (all that remain at a clean finish)."""
        if not self._enabled:
            return []
        logprobs = self._logprobs_of(delta)
        if delta.finish_reason is FinishReason.STOP and logprobs:
            logprobs = logprobs[:-1]  # the end-of-generation token: no text, not shown
        self._pending.extend(self._texts.entry(lp) for lp in logprobs)
        self._released += len(delta.text.encode())
        ready = []
        while self._pending and len(self._pending[0].token.raw) <= self._released:
            entry = self._pending.popleft()
            self._released -= len(entry.token.raw)
            ready.append(entry)
        if delta.finish_reason is not None:
            ready.extend(self._finish(delta.finish_reason))
        return ready

    def _finish(self, reason: FinishReason) -> list[TokenEntry]:
        """At the end: all held tokens when their text was all released, else the ones
        partly shown (a stop string cut through them)."""
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            rest = list(self._pending)
        else:
            rest = []
            while self._pending and self._released > 0:
                entry = self._pending.popleft()
                self._released -= len(entry.token.raw)
                rest.append(entry)
        self._pending.clear()
        return rest

    @staticmethod
    def _logprobs_of(delta: RequestDelta) -> list[TokenLogprob]:
        if not delta.token_ids:
            return list(delta.logprobs or [])
        if delta.logprobs is None or len(delta.logprobs) != len(delta.token_ids):
            raise EngineError("the engine did not return the logprobs of the sampled tokens")
        return delta.logprobs
