"""Which OpenAI parameters InferFlux accepts and ignores, and which it refuses for now.

Owns the one list of accepted-and-ignored hints (`ACCEPTED_IGNORED`, also the table in
docs/api.md) and `reject_unsupported`, the one function that refuses features that would
change the output if honoured: tools, audio, best_of > n... A parameter
is ignored only when OpenAI documents it as an optional hint whose absence cannot change
what the model generates; anything that constrains the output is either honoured or
refused with a 400 naming it. Nothing is silently dropped.

Replace the matching entry of `_UNSUPPORTED` when a feature lands (tools are another
issue; structured output, `response_format`, is honoured: `api/structured.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from inferflux.api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
)
from inferflux.errors import InvalidRequest

ACCEPTED_IGNORED: dict[str, str] = {
    "user": "end-user id for OpenAI's abuse monitoring",
    "safety_identifier": "end-user id for OpenAI's abuse monitoring",
    "metadata": "tags for OpenAI's stored completions",
    "store": "whether OpenAI stores the completion; InferFlux never does",
    "service_tier": "OpenAI billing tier; use `priority` to schedule",
    "prompt_cache_key": "OpenAI cache routing hint; the prefix cache needs none",
    "parallel_tool_calls": "only meaningful with tools, which are refused",
    "stream_options.include_obfuscation": "InferFlux adds no obfuscation padding",
    "response_format.json_schema.strict": "the schema is always enforced exactly",
    "modalities": 'only ["text"] (the default) is accepted',
    "tool_choice": '"none" or "auto" with no tools (nothing to choose from)',
    "function_call": '"none" or "auto" with no functions',
    "tools / functions": "an empty list (no tools)",
    "best_of": "only equal to n (each choice is already its own sample)",
    "suffix": 'only "" (no insertion)',
}


def _is_none_or(*allowed: object) -> Callable[[object], bool]:
    return lambda value: value is None or value in allowed


# name → (is acceptable, why it is refused otherwise)
_Check = tuple[Callable[[object], bool], str]
_TOOLS = "tool calling is not supported yet"
_CHAT_UNSUPPORTED: dict[str, _Check] = {
    "tools": (lambda v: not v, _TOOLS),
    "tool_choice": (_is_none_or("none", "auto"), _TOOLS),
    "functions": (lambda v: not v, _TOOLS),
    "function_call": (_is_none_or("none", "auto"), _TOOLS),
    "modalities": (lambda v: v is None or v == ["text"], "this server generates text only"),
    "audio": (_is_none_or(), "audio output is not supported"),
    "prediction": (_is_none_or(), "predicted outputs are not supported"),
    "web_search_options": (_is_none_or(), "web search is not supported"),
    "reasoning_effort": (_is_none_or(), "reasoning_effort is not supported by this model"),
    "verbosity": (_is_none_or(), "verbosity is not supported by this model"),
}
_COMPLETION_UNSUPPORTED: dict[str, _Check] = {
    "suffix": (_is_none_or(""), "suffix (insertion) is not supported"),
}


def reject_unsupported(request: GenerationRequest) -> None:
    """Raise InvalidRequest naming the first feature that is set but not supported."""
    checks = (
        _CHAT_UNSUPPORTED if isinstance(request, ChatCompletionRequest) else _COMPLETION_UNSUPPORTED
    )
    for name, (acceptable, why) in checks.items():
        if not acceptable(getattr(request, name)):
            raise InvalidRequest(why, param=name)
    best_of = request.best_of if isinstance(request, CompletionRequest) else None
    if best_of is not None and best_of != request.num_choices():
        raise InvalidRequest(
            "best_of other than n is not supported (server-side ranking); leave it out "
            "or set it equal to n",
            param="best_of",
        )
