"""Self-checks of the structured-output corpus: valid 2020-12 schemas, satisfiable, varied."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from tests.contract.corpus import (
    FORMAT_CHECKER,
    NAME_RE,
    feature_counts,
    judge_output,
    load_corpus,
    sample,
    schema_features,
    validation_errors,
)

CASES = load_corpus()
MIN_CASES = 110
# feature → the least number of schemas that must use it, so the corpus stays varied
MIN_COVERAGE = {
    "nested object": 20, "optional property": 10, "additionalProperties false": 50,
    "minItems": 10, "maxItems": 10, "prefixItems": 2, "enum": 20, "const": 5, "anyOf": 5,
    "oneOf": 3, "allOf": 2, "$ref": 10, "recursive $ref": 1, "pattern": 15, "maxLength": 50,
    "unbounded string": 5, "minimum": 20, "maximum": 20, "exclusiveMinimum": 3,
    "exclusiveMaximum": 2, "multipleOf": 1, "boolean": 10, "null": 3, "non-object root": 3,
    "type list": 2, "format:date": 3, "format:date-time": 3, "format:email": 5,
    "format:uuid": 2, "format:ipv4": 1, "format:ipv6": 1, "format:hostname": 2,
    "format:uri": 2, "format:time": 1, "format:duration": 1,
}  # fmt: skip


def test_the_corpus_is_large_and_names_are_unique_valid_and_match_files() -> None:
    assert len(CASES) >= MIN_CASES
    names = [case.name for case in CASES]
    assert len(set(names)) == len(names)
    for case in CASES:
        assert NAME_RE.fullmatch(case.name), case.name
        assert case.path.stem == case.name


def test_prompts_are_distinct_sentences() -> None:
    prompts = [case.prompt for case in CASES]
    assert len(set(prompts)) == len(prompts)
    assert all(10 <= len(p) <= 300 for p in prompts), [p for p in prompts if len(p) > 300]


def test_the_metaschema_itself_is_valid() -> None:
    Draft202012Validator.check_schema(Draft202012Validator.META_SCHEMA)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_schema_is_valid_2020_12_and_its_example_satisfies_it(case) -> None:
    Draft202012Validator.check_schema(case.schema)  # raises SchemaError with the path
    assert validation_errors(case.schema, case.example) == []
    assert judge_output(case.schema, json.dumps(case.example)) is None


def test_every_format_used_has_an_asserting_checker() -> None:
    features = {f for case in CASES for f in schema_features(case.schema)}
    used = {f.removeprefix("format:") for f in features if f.startswith("format:")}
    assert used and used <= set(FORMAT_CHECKER.checkers), used - set(FORMAT_CHECKER.checkers)


def test_the_corpus_covers_every_feature() -> None:
    counts = feature_counts(CASES)
    short = {f: (counts[f], need) for f, need in MIN_COVERAGE.items() if counts[f] < need}
    assert not short, f"feature: (schemas, needed) = {short}"


def test_the_sample_make_test_runs_uses_every_feature_in_a_third_of_the_cases() -> None:
    chosen = sample(CASES)
    assert set(feature_counts(chosen)) == set(feature_counts(CASES))
    assert len(CASES) // 3 <= len(chosen) <= len(CASES) // 2
    assert [c.name for c in chosen] == sorted(c.name for c in chosen)  # corpus order
    assert {c.name for c in CASES[::3]} <= {c.name for c in chosen}


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("date", "2024-02-29", "2023-02-29"),
        ("date-time", "2024-05-01T12:30:00Z", "2024-05-01 12:30"),
        ("date-time", "2024-05-01T12:30:00.5+02:00", "2024-13-01T12:30:00Z"),
        ("time", "07:30:00Z", "07:30:00"),
        ("email", "a.b@example.com", "not an email"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
        ("ipv4", "192.168.1.10", "256.1.1.1"),
        ("ipv6", "::1", "::g"),
        ("hostname", "web01.example.com", "-bad-.example.com"),
        ("uri", "https://example.com/docs?q=1", "example dot com"),
        ("duration", "PT2H30M", "P"),
        ("duration", "P3W", "PT"),
    ],
)
def test_format_checkers(fmt: str, good: str, bad: str) -> None:
    schema = {"type": "string", "format": fmt}
    assert validation_errors(schema, good) == []
    assert validation_errors(schema, bad) != []


def test_judge_output_reports_broken_json_and_schema_violations() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert judge_output(schema, '{"a": 1}') is None
    assert (judge_output(schema, '{"a": 1') or "").startswith("not JSON")
    assert "required" in (judge_output(schema, "{}") or "")


def test_schema_features_sees_nesting_recursion_and_formats() -> None:
    schema = {
        "$defs": {"node": {"type": "object", "properties": {"kids": {
            "type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}}},
        "type": "object",
        "properties": {
            "root": {"$ref": "#/$defs/node"}, "at": {"type": "string", "format": "date"}},
        "required": ["root"],
    }  # fmt: skip
    found = schema_features(schema)
    expected = {"recursive $ref", "nested object", "format:date", "optional property", "maxItems"}
    assert expected <= found
    assert "non-object root" not in found
    assert "non-object root" in schema_features({"enum": ["yes", "no"]})
