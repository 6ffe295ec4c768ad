"""The structured_output report and the JSON Schema check at the edge (pure logic), and
the report over the fake engine: a JSON-constrained choice whose text is not JSON is
flagged and never reported as a clean stop."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from inferflux.api.structured import OutputConstraint, check_schema, structured_output_report
from inferflux.api.structured import _json_validator as json_validator
from inferflux.errors import InvalidRequest
from tests.unit.api.test_routes import sse_payloads

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0},
        "day": {"type": "string", "format": "date"},
    },
    "required": ["n"],
}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"n": 3}', None),
        ('{"n": 3, "day": "2026-11-22"}', None),
        ('{"n": -1}', "at n"),
        ('{"n": 3, "day": "yesterday"}', "at day"),
        ('{"n": 3', "not complete JSON"),
        ("[]", "the document"),
    ],
)
def test_outputs_are_validated_against_the_schema(text: str, error: str | None) -> None:
    problem = json_validator(SCHEMA)(text)
    assert problem is None if error is None else error in (problem or "")


def test_the_report_never_passes_off_an_invalid_answer() -> None:
    constraint = OutputConstraint("grammar", json_validator(SCHEMA))
    assert structured_output_report(constraint, '{"n": 1}', "stop") == (
        {"valid": True, "error": None},
        "stop",
    )
    report, finish = structured_output_report(constraint, '{"n": ', "length")
    assert finish == "length" and report["valid"] is False
    report, finish = structured_output_report(constraint, '{"n": "x"}', "stop")
    assert finish == "error" and report["valid"] is False


@pytest.mark.parametrize("schema", [{"type": "wat"}, {"minimum": "zero"}, {"required": "n"}])
def test_invalid_json_schemas_are_400(schema: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest, match="invalid JSON schema") as refused:
        check_schema(schema, "response_format.json_schema.schema")
    assert refused.value.param == "response_format.json_schema.schema"


JSON_OBJECT = {"type": "json_object"}


async def test_a_non_json_answer_under_json_object_is_flagged(client: httpx.AsyncClient) -> None:
    # the fake engine ignores constraints and answers "Hello, world!"
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": JSON_OBJECT}
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert choice["finish_reason"] == "error"
    assert choice["structured_output"]["valid"] is False
    stream = await client.post("/v1/chat/completions", json={**body, "stream": True})
    events = [p for p in sse_payloads(stream) if isinstance(p, dict)]
    last = events[-1]["choices"][0]
    assert last["finish_reason"] == "error" and last["structured_output"]["valid"] is False


async def test_free_text_answers_carry_no_report(client: httpx.AsyncClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"}}
    choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert "structured_output" not in choice and choice["finish_reason"] == "stop"


def test_the_api_imports_jsonschema_only_for_a_schema() -> None:
    """Its import builds Lark parsers (34 MB, up to 0.8 s) when its format extras are
    installed: a fresh API process, and one that checked a schema-less JSON output, have
    not paid for it."""
    code = (
        "import sys, inferflux.api.app\n"
        "from inferflux.api.structured import _json_validator\n"
        "assert _json_validator(None)('{}') is None\n"
        "print('jsonschema' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"
