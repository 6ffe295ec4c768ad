"""Structured output at the HTTP edge: what a request asks for → an engine constraint, and
the check of what came out.

Owns `OutputConstraint` (the llguidance grammar that goes into `SamplingParams.constraint`,
plus how to validate the finished text) and the functions that build one from a JSON
schema (OpenAI `response_format`, Ollama `format`) or a raw grammar (GBNF, Lark, regex).
Does not own compiling grammars (`engine/grammar.py`'s `ConstraintCompiler`) or request
parsing (each API's protocol module).

Fail closed: a schema that is not valid JSON Schema, cannot be compiled, or exceeds the
`structured_output.*` limits is an InvalidRequest (400) before anything is queued. Every
finished output under a schema is validated again with jsonschema; a failure is flagged
(`structured_output.valid: false`) and never reported as a complete answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import anyio

from inferflux.engine.grammar import ConstraintCompiler
from inferflux.errors import InvalidRequest

GrammarSyntax = Literal["gbnf", "lark", "regex"]
_MAX_REPORTED_CHARS = 300


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """A compiled constraint and, for JSON, the check its finished output must pass."""

    grammar: str  # for SamplingParams.constraint
    # text → None when valid, else why not; None for raw grammars (the grammar is the spec)
    validate: Callable[[str], str | None] | None = None

    def check(self, text: str) -> str | None:
        """Why `text` is not a valid finished output, or None."""
        return None if self.validate is None else self.validate(text)


def _short(message: str) -> str:
    return message if len(message) <= _MAX_REPORTED_CHARS else message[:_MAX_REPORTED_CHARS] + "…"


def _json_validator(schema: Mapping[str, object] | None) -> Callable[[str], str | None]:
    """A check of finished text against `schema` (None: any JSON object)."""
    validator = None
    if schema is not None:
        # NOTE: jsonschema is imported on the first schema, off the event loop
        # (schema_constraint): with its format extras installed it builds 39 Lark parsers
        # at import (0.3-0.8 s of CPU, 34 MB) that a server without schemas never needs.
        from jsonschema import validators

        cls = validators.validator_for(schema)
        # NOTE: the draft's own checker; a bare FormatChecker() mixes every draft's, and its
        # draft-3 "time" (HH:MM:SS) rejects the RFC 3339 times llguidance generates
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def validate(text: str) -> str | None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"the output is not complete JSON ({exc.msg} at character {exc.pos})"
        if validator is None:
            return None if isinstance(value, dict) else "the output is not a JSON object"
        from jsonschema.exceptions import best_match  # loaded with the validator: a lookup

        try:
            error = best_match(validator.iter_errors(value))
        except Exception as exc:  # NOTE: an untrusted schema (a $ref that resolves nowhere)
            return _short(f"the output could not be checked against the schema: {exc}")
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "the document"
        return _short(f"the output does not match the schema at {where}: {error.message}")

    return validate


def check_schema(schema: object, param: str) -> Mapping[str, object]:
    """`schema` if it is a valid JSON Schema (by its `$schema`, default 2020-12); raises
    InvalidRequest naming what is wrong."""
    if not isinstance(schema, dict):
        raise InvalidRequest("the JSON schema must be an object", param=param)
    from jsonschema import SchemaError, validators  # NOTE: on first use: _json_validator

    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise InvalidRequest(
            _short(f"invalid JSON schema at {where}: {exc.message}"), param=param
        ) from None
    return schema


async def schema_constraint(
    compiler: ConstraintCompiler, schema: object | None, param: str
) -> OutputConstraint:
    """The constraint for JSON documents valid under `schema` (None: any JSON object).
    Raises InvalidRequest (400, `param`) for a schema that is invalid or cannot be enforced.
    """
    if schema is None:
        grammar = await anyio.to_thread.run_sync(lambda: compiler.json_object(param=param))
        return OutputConstraint(grammar, _json_validator(None))
    compiler.check_schema_bounds(schema, param)  # before any recursive validator
    checked = await anyio.to_thread.run_sync(check_schema, schema, param)
    grammar = await anyio.to_thread.run_sync(lambda: compiler.json_schema(checked, param=param))
    return OutputConstraint(grammar, await anyio.to_thread.run_sync(_json_validator, checked))


async def grammar_constraint(
    compiler: ConstraintCompiler, text: str, syntax: GrammarSyntax, param: str
) -> OutputConstraint:
    """The constraint for a raw grammar in `syntax`. Raises InvalidRequest (400)."""
    compile_ = {"gbnf": compiler.gbnf, "lark": compiler.lark, "regex": compiler.regex}[syntax]
    grammar = await anyio.to_thread.run_sync(lambda: compile_(text, param=param))
    return OutputConstraint(grammar)


def structured_output_report(
    constraint: OutputConstraint, text: str, finish_reason: str
) -> tuple[dict[str, object], str]:
    """The `structured_output` field of a finished choice and its finish_reason.

    A JSON output that fails its check is never passed off as complete: it keeps
    `length` when it was cut at max_tokens, and otherwise becomes `error`.
    """
    error = constraint.check(text)
    if error is not None and finish_reason != "length":
        finish_reason = "error"
    return {"valid": error is None, "error": error}, finish_reason
