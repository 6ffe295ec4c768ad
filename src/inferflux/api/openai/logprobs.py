"""Log-probabilities in OpenAI's shapes: chat's `logprobs.content[]` and the legacy
completions' `{tokens, token_logprobs, top_logprobs, text_offset}`. The entries
themselves, aligned with the released text, come from the generation service
(api/generation/logprobs.py).
"""

from __future__ import annotations

import codecs

from inferflux.api.generation.logprobs import TokenEntry, TokenText


def _chat_token(text: TokenText, logprob: float) -> dict[str, object]:
    return {"token": text.text, "logprob": logprob, "bytes": list(text.raw)}


def chat_logprobs(entries: list[TokenEntry]) -> dict[str, object]:
    """Chat's `choice.logprobs`: `{"content": [...], "refusal": null}`."""
    content = []
    for entry in entries:
        item = _chat_token(entry.token, entry.logprob if entry.logprob is not None else 0.0)
        item["top_logprobs"] = [_chat_token(t, lp) for t, lp in entry.top or ()]
        content.append(item)
    return {"content": content, "refusal": None}


class CompletionLogprobs:
    """The legacy completions' `logprobs` object for one choice, chunk by chunk.

    `text_offset` counts characters from the start of the choice's text (the echoed
    prompt included), so it carries state across chunks: one instance per choice.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._offset = 0

    def render(self, entries: list[TokenEntry]) -> dict[str, object]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offset: list[int] = []
        for entry in entries:
            tokens.append(entry.token.text)
            token_logprobs.append(entry.logprob)
            top_logprobs.append(_top_dict(entry))
            text_offset.append(self._offset)
            self._offset += len(self._decoder.decode(entry.token.raw))
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        }


def _top_dict(entry: TokenEntry) -> dict[str, float] | None:
    """The most likely tokens plus the sampled one (OpenAI: up to logprobs + 1 keys)."""
    if entry.top is None or entry.logprob is None:
        return None
    top: dict[str, float] = {}
    for text, logprob in entry.top:
        top.setdefault(text.text, logprob)
    top.setdefault(entry.token.text, entry.logprob)
    return top
