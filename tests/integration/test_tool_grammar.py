"""Tool-call grammars against a real vocabulary (SmolLM2's): llguidance compiles every
format's grammar through the server's `ConstraintCompiler`, and the grammars accept
exactly the calls they should (token by token, as the engine would enforce them)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from llguidance import LLMatcher

from inferflux.api.tools.formats import GENERIC, HERMES, LLAMA3, MISTRAL, ToolFormat
from inferflux.api.tools.grammar import tool_call_grammar
from inferflux.api.tools.protocol import FunctionSpec, ToolPlan
from inferflux.engine.backends.llama_cpp import LlamaTokenizer
from inferflux.engine.grammar import ConstraintCompiler

pytestmark = pytest.mark.model

WEATHER = FunctionSpec(
    "get_weather",
    None,
    {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
TIME = FunctionSpec("get_time", None, {"type": "object", "properties": {}})
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(smollm2_model_path: str) -> Iterator[LlamaTokenizer]:
    tok = LlamaTokenizer(smollm2_model_path)
    yield tok
    tok.close()


def accepts(tokenizer: LlamaTokenizer, fmt: ToolFormat, plan: ToolPlan, text: str) -> str:
    """ "stopped" (the grammar is complete), "open" (more may follow) or "rejected"."""
    grammar = ConstraintCompiler(tokenizer.constraint_error).lark(
        tool_call_grammar(fmt, plan), param="tools"
    )
    matcher = LLMatcher(tokenizer._grammar_tokenizer.get(), grammar)  # noqa: SLF001 (test)
    ids = tokenizer.tokenize(text, add_special=False, parse_special=False)
    if matcher.validate_tokens(ids) != len(ids):
        return "rejected"
    assert matcher.consume_tokens(ids)
    return "stopped" if matcher.is_stopped() else "open"


@pytest.mark.parametrize("fmt", [GENERIC, HERMES, LLAMA3, MISTRAL])
@pytest.mark.parametrize("required", [True, False])
@pytest.mark.parametrize("parallel", [True, False])
def test_every_format_compiles(
    tokenizer: LlamaTokenizer, fmt: ToolFormat, required: bool, parallel: bool
) -> None:
    plan = ToolPlan((WEATHER, TIME), required, None, parallel)
    grammar = ConstraintCompiler(tokenizer.constraint_error).lark(
        tool_call_grammar(fmt, plan), param="tools"
    )
    assert grammar


def test_required_accepts_valid_calls_only(tokenizer: LlamaTokenizer) -> None:
    one = ToolPlan((WEATHER, TIME), True, None, False)
    many = ToolPlan((WEATHER, TIME), True, None, True)
    assert accepts(tokenizer, GENERIC, one, CALL) == "stopped"
    assert accepts(tokenizer, GENERIC, many, CALL) == "open"
    assert accepts(tokenizer, GENERIC, many, f"{CALL}\n{CALL}") == "open"
    assert accepts(tokenizer, GENERIC, one, "Sure! " + CALL) == "rejected"
    unknown = CALL.replace("get_weather", "get_wether")
    assert accepts(tokenizer, GENERIC, one, unknown) == "rejected"
    wrong_args = CALL.replace('"city": "Paris"', '"town": "Paris"')
    assert accepts(tokenizer, GENERIC, one, wrong_args) == "rejected"
    compact = CALL.replace('", "', '","')
    assert accepts(tokenizer, GENERIC, one, compact) == "rejected"  # one layout only


def test_auto_is_free_text_until_the_trigger(tokenizer: LlamaTokenizer) -> None:
    auto = ToolPlan((WEATHER, TIME), False, None, False)
    assert accepts(tokenizer, GENERIC, auto, "It is sunny in <b>Paris</b>.") == "open"
    assert accepts(tokenizer, GENERIC, auto, "Let me check. " + CALL) == "stopped"
    bad = "Let me check. " + CALL.replace("get_weather", "get_wether")
    assert accepts(tokenizer, GENERIC, auto, bad) == "rejected"


def test_named_function_and_other_formats(tokenizer: LlamaTokenizer) -> None:
    named = ToolPlan((WEATHER, TIME), True, "get_time", False)
    time_call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert accepts(tokenizer, GENERIC, named, time_call) == "stopped"
    assert accepts(tokenizer, GENERIC, named, CALL) == "rejected"
    llama = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert accepts(tokenizer, LLAMA3, ToolPlan((WEATHER,), True, None, False), llama) == "stopped"
    auto = ToolPlan((WEATHER,), False, None, False)
    assert accepts(tokenizer, LLAMA3, auto, "Sure: " + llama) == "stopped"
    mistral = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    assert accepts(tokenizer, MISTRAL, auto, "Hm. " + mistral) == "stopped"
