"""The structured-output contract corpus: JSON schemas with prompts, and how to judge outputs.

Owns: loading `tests/contract/schemas/*.json` (one case per file, see README.md there),
the validator every contract check uses (JSON Schema 2020-12 with `format` asserted by
the checkers below, so a result does not depend on which optional jsonschema extras are
installed), and the feature tally that keeps the corpus varied. Does not talk to a server:
`tests/integration/test_structured_contract.py` and `bench/constrained.py` do.

    python -m tests.contract.corpus      # prints the feature table of the README
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for json_schema.name


@dataclass(frozen=True, slots=True)
class ContractCase:
    """One schema, the prompt that asks for such data, and a valid example instance."""

    name: str
    prompt: str
    schema: dict[str, Any]  # Any: JSON
    example: Any  # Any: JSON; proves the schema is satisfiable
    path: Path


def load_corpus(directory: Path = SCHEMAS_DIR) -> list[ContractCase]:
    """Every case of `directory`, sorted by file name."""
    cases = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        cases.append(
            ContractCase(data["name"], data["prompt"], data["schema"], data["example"], path)
        )
    return cases


# --- formats: RFC 3339 dates and times, RFC 1123 host names, ISO 8601 durations ---------

FORMAT_CHECKER = FormatChecker(formats=())
_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"
_TIME_RE = re.compile(_TIME)
_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}")
_DATE_TIME_RE = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt](" + _TIME + ")")
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+")  # RFC 5322 addr-spec allows a one-label domain
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s\"<>\\^`{|}]*")
_DURATION_RE = re.compile(
    r"P((\d+W)|(\d+Y)?(\d+M)?(\d+D)?(T(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?)"
)  # fmt: skip


def _checks(name: str) -> Any:  # Any: decorator from jsonschema
    return FORMAT_CHECKER.checks(name, raises=ValueError)


@_checks("date")
def _is_date(value: object) -> bool:
    return not isinstance(value, str) or bool(
        _DATE_RE.fullmatch(value) and date.fromisoformat(value)
    )


@_checks("time")
def _is_time(value: object) -> bool:
    return not isinstance(value, str) or bool(_TIME_RE.fullmatch(value))


@_checks("date-time")
def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    match = _DATE_TIME_RE.fullmatch(value)
    return bool(match and date.fromisoformat(match.group(1)))


@_checks("email")
def _is_email(value: object) -> bool:
    return not isinstance(value, str) or bool(_EMAIL_RE.fullmatch(value))


@_checks("uuid")
def _is_uuid(value: object) -> bool:
    return not isinstance(value, str) or bool(_UUID_RE.fullmatch(value) and uuid.UUID(value))


@_checks("ipv4")
def _is_ipv4(value: object) -> bool:
    if isinstance(value, str):
        ipaddress.IPv4Address(value)  # raises AddressValueError, a ValueError
    return True


@_checks("ipv6")
def _is_ipv6(value: object) -> bool:
    if isinstance(value, str):
        ipaddress.IPv6Address(value)
    return True


@_checks("hostname")
def _is_hostname(value: object) -> bool:
    if not isinstance(value, str):
        return True
    labels = value.removesuffix(".").split(".")
    return len(value) <= 253 and all(_LABEL_RE.fullmatch(label) for label in labels)


@_checks("uri")
def _is_uri(value: object) -> bool:
    return not isinstance(value, str) or bool(_URI_RE.fullmatch(value))


@_checks("duration")
def _is_duration(value: object) -> bool:
    if not isinstance(value, str):
        return True
    return (
        value not in ("P", "PT") and not value.endswith("T") and bool(_DURATION_RE.fullmatch(value))
    )


def validator_for(schema: dict[str, Any] | bool) -> Draft202012Validator:  # Any: JSON
    """A 2020-12 validator for `schema` that asserts the formats above."""
    return Draft202012Validator(schema, format_checker=FORMAT_CHECKER)


def validation_errors(schema: dict[str, Any], instance: Any) -> list[str]:  # Any: JSON
    """Why `instance` does not satisfy `schema` (formats included); empty when it does."""
    return [error.message for error in validator_for(schema).iter_errors(instance)]


def judge_output(schema: dict[str, Any], text: str) -> str | None:  # Any: JSON
    """None when `text` is JSON that satisfies `schema`, else the first problem found."""
    try:
        instance = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc}"
    errors = validation_errors(schema, instance)
    return errors[0] if errors else None


# --- feature tally ------------------------------------------------------------------------

_KEYWORD_FEATURES = (
    "required", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "pattern",
    "minLength", "maxLength", "minItems", "maxItems", "prefixItems", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "patternProperties", "maxProperties",
)  # fmt: skip
_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONES = ("items", "additionalProperties")


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:  # Any: JSON
    for key in _SUBSCHEMA_MAPS:
        for child in (node.get(key) or {}).values():
            yield key, child
    for key in _SUBSCHEMA_LISTS:
        for child in node.get(key) or []:
            yield key, child
    for key in _SUBSCHEMA_ONES:
        if isinstance(node.get(key), dict):
            yield key, node[key]


def _node_features(node: dict[str, Any], object_depth: int) -> set[str]:  # Any: JSON
    found = {key for key in _KEYWORD_FEATURES if key in node}
    types = node.get("type")
    if isinstance(types, list):
        found.add("type list")
    found.update(types if isinstance(types, list) else [types] if types else [])
    if "format" in node:
        found.add(f"format:{node['format']}")
    if node.get("additionalProperties") is False:
        found.add("additionalProperties false")
    if types == "object" and object_depth >= 1:
        found.add("nested object")
    props = node.get("properties") or {}
    if set(props) - set(node.get("required") or []):
        found.add("optional property")
    bounded = {"maxLength", "enum", "const", "format", "pattern"} & set(node)
    if types == "string" and not bounded:
        found.add("unbounded string")
    return found


def schema_features(schema: dict[str, Any]) -> set[str]:  # Any: JSON
    """The JSON Schema features `schema` uses (keywords, types, formats, nesting, recursion)."""
    found: set[str] = set()
    if schema.get("type") != "object" and not {"properties", "$ref", "allOf", "oneOf"} & set(
        schema
    ):
        found.add("non-object root")
    stack: list[tuple[dict[str, Any], int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        found |= _node_features(node, depth)
        below = depth + (node.get("type") == "object")
        stack.extend((child, below) for _, child in _subschemas(node) if isinstance(child, dict))
    if _is_recursive(schema):
        found.add("recursive $ref")
    return found


def sample(cases: list[ContractCase], every: int = 3) -> list[ContractCase]:
    """Every `every`-th case, plus the first case of each feature (`schema_features`) none
    of those uses: a smaller corpus that still uses every feature. In corpus order."""
    chosen = {case.name for case in cases[::every]}
    covered = {f for case in cases if case.name in chosen for f in schema_features(case.schema)}
    for case in cases:
        missing = schema_features(case.schema) - covered
        if missing:
            chosen.add(case.name)
            covered |= missing
    return [case for case in cases if case.name in chosen]


def _refs(node: Any) -> Iterator[str]:  # Any: JSON
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"].removeprefix("#/$defs/")
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _is_recursive(schema: dict[str, Any]) -> bool:  # Any: JSON
    defs = schema.get("$defs") or {}
    for start in defs:
        seen: set[str] = set()
        todo = list(_refs(defs[start]))
        while todo:
            name = todo.pop()
            if name == start:
                return True
            if name in defs and name not in seen:
                seen.add(name)
                todo.extend(_refs(defs[name]))
    return False


def feature_counts(cases: list[ContractCase]) -> Counter[str]:
    """How many cases use each feature."""
    return Counter(feature for case in cases for feature in schema_features(case.schema))


def _main() -> int:
    cases = load_corpus()
    sys.stdout.write(f"{len(cases)} schemas\n\n| feature | schemas |\n| --- | --- |\n")
    for feature, count in sorted(feature_counts(cases).items(), key=lambda kv: (-kv[1], kv[0])):
        sys.stdout.write(f"| {feature} | {count} |\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
