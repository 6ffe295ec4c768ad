"""api/structured.py: format values as llguidance writes them pass the draft 2020-12 check."""

from __future__ import annotations

import pytest

from inferflux.api.structured import schema_constraint, structured_output_report
from inferflux.engine.grammar import ConstraintCompiler
from tests.fakes.engine import FakeTokenizer


async def _constraint(schema: dict[str, object]):
    compiler = ConstraintCompiler(FakeTokenizer().constraint_error)
    return await schema_constraint(compiler, schema, "response_format")


@pytest.mark.parametrize(
    ("fmt", "value"),
    [
        ("time", "07:30:00Z"),  # RFC 3339, as llguidance generates it (draft 3 wanted HH:MM:SS)
        ("time", "23:59:59.5+02:00"),
        ("date", "2024-02-29"),
        ("date-time", "2024-05-01T12:30:00Z"),
        ("email", "ops@example.com"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000"),
        ("ipv4", "192.168.1.10"),
    ],
)
async def test_rfc_3339_and_other_format_values_are_valid(fmt: str, value: str) -> None:
    constraint = await _constraint({"type": "object", "properties": {"v": {"format": fmt}}})
    report, finish = structured_output_report(constraint, f'{{"v": "{value}"}}', "stop")
    assert report == {"valid": True, "error": None}
    assert finish == "stop"


async def test_format_violations_and_cut_outputs_are_flagged() -> None:
    constraint = await _constraint({"type": "object", "properties": {"d": {"format": "date"}}})
    report, finish = structured_output_report(constraint, '{"d": "2023-02-30"}', "stop")
    assert report["valid"] is False and "date" in str(report["error"])
    assert finish == "error"
    report, finish = structured_output_report(constraint, '{"d": "2023-', "length")
    assert report["valid"] is False and finish == "length"
