"""ConstraintCompiler: limits, fail-closed errors, caching, json_depth (pure logic: the
grammars are compiled by llguidance; the vocabulary check is llguidance's own check
without a vocabulary, as the fake tokenizer does)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferflux.engine.grammar import ConstraintCompiler, GrammarLimits, json_depth
from inferflux.errors import InvalidRequest
from tests.fakes.engine import FakeTokenizer


class CountingValidator:
    """The fake tokenizer's vocabulary-free check, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, grammar: str) -> str | None:
        self.calls += 1
        return FakeTokenizer().constraint_error(grammar)


def compiler(**limits: int) -> ConstraintCompiler:
    return ConstraintCompiler(CountingValidator(), GrammarLimits(**limits))


def test_each_kind_compiles_to_a_grammar() -> None:
    c = compiler()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    grammars = {
        c.json_schema(schema, param="p"),
        c.json_object(param="p"),
        c.gbnf('root ::= "yes" | "no"', param="p"),
        c.lark('start: "id-" /[0-9]+/', param="p"),
        c.regex("[a-z]{3}", param="p"),
    }
    assert len(grammars) == 5 and all(grammars)


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        ("gbnf", "root ::= (", "not valid GBNF"),
        ("gbnf", 'x ::= "a"', "root"),
        ("lark", "start: (", "cannot be enforced"),
        ("regex", "[a-", "cannot be enforced"),
        ("gbnf", "   ", "empty"),
    ],
)
def test_invalid_grammars_are_400_naming_the_param(kind: str, text: str, message: str) -> None:
    c = compiler()
    with pytest.raises(InvalidRequest, match=message) as refused:
        getattr(c, kind)(text, param="grammar")
    assert refused.value.param == "grammar" and refused.value.http_status == 400


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "format": "no-such-format"}, "Unknown format"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"not": {"type": "string"}}, "not"),
        ([1, 2], "must be an object"),
    ],
)
def test_schemas_llguidance_cannot_enforce_are_refused(schema: object, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        compiler().json_schema(schema, param="response_format")


def test_schema_size_depth_and_grammar_length_limits_name_the_config_key() -> None:
    c = compiler(max_schema_bytes=300, max_schema_depth=4, max_grammar_chars=300)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)}}
    with pytest.raises(InvalidRequest, match="max_schema_bytes"):
        c.json_schema(wide, param="p")
    deep: dict[str, object] = {"type": "integer"}
    for _ in range(6):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidRequest, match="max_schema_depth"):
        c.json_schema(deep, param="p")
    with pytest.raises(InvalidRequest, match="max_grammar_chars"):
        c.gbnf('root ::= "' + "a" * 400 + '"', param="p")


def test_results_and_refusals_are_cached_per_input() -> None:
    validator = CountingValidator()
    c = ConstraintCompiler(validator)
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    first = c.json_schema(schema, param="p")
    assert c.json_schema(json.loads(json.dumps(schema)), param="q") == first
    assert validator.calls == 1
    # property order is output order: a reordered schema is another grammar
    reordered = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    }
    assert c.json_schema(reordered, param="p") != first
    for param in ("x", "y"):  # a cached refusal still names the caller's param
        with pytest.raises(InvalidRequest) as refused:
            c.regex("[a-", param=param)
        assert refused.value.param == param
    assert validator.calls == 3


json_values = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3)
    ),
    max_leaves=20,
)


def _recursive_depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_recursive_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_recursive_depth(v) for v in value), default=0)
    return 0


@given(json_values)
def test_json_depth_matches_the_recursive_definition(value: object) -> None:
    assert json_depth(value) == _recursive_depth(value)


def test_json_depth_needs_no_recursion() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert json_depth(deep) == 100_001
