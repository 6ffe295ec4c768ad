"""Schemathesis against the live server's /openapi.json: bounded, deterministic, 0 failures.

Every documented operation gets generated requests, half valid by the schema (positive) and
half not (negative), checked with `not_a_server_error` (never a 5xx) and
`response_schema_conformance` (the body matches what the document promises for that status
and media type, SSE events included). At most `MAX_CASES` requests in all, derandomized
(a fixed seed), no shrinking; generation is capped at a few tokens per request (`clamp`) so
the run stays within a few minutes on 2 cores.

`make chaos` (tests/chaos/fuzz.py) runs it on a throwaway server with more cases
(`INFERFLUX_SCHEMATHESIS_CASES`, 1,000) and the admin routes too
(`INFERFLUX_SCHEMATHESIS_ADMIN=1`; they run last, since they may unload the model).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

pytestmark = [pytest.mark.model, pytest.mark.server]

MAX_CASES = int(os.environ.get("INFERFLUX_SCHEMATHESIS_CASES", "300"))
WITH_ADMIN = os.environ.get("INFERFLUX_SCHEMATHESIS_ADMIN") == "1"
MIN_CASES_PER_MODE = 4
MAX_TOKENS = 3  # generated tokens per request at most
MAX_CHOICES = 2
MAX_WORKERS = 2  # POST /v1/admin/workers: more would start GBs of workers
REQUEST_TIMEOUT_S = 60.0
CHECKS = [not_a_server_error, response_schema_conformance]
# Fields that would make one request generate for a long time, or change the server for the
# tests that share it (Ollama's keep_alive: 0 unloads the model).
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
DROPPED_FIELDS = ("keep_alive",)


@pytest.fixture(scope="module")
def api_schema(server_url: str) -> Any:  # Any: schemathesis' BaseSchema
    return schemathesis.openapi.from_url(f"{server_url}/openapi.json", timeout=30)


def clamp(case: Case, model_id: str) -> None:
    """Cap what one generated request can ask of the engine; keep invalid values invalid.
    A model name that is a string becomes the served one (random names only meet 404s)."""
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = model_id
    for field in DROPPED_FIELDS:
        body.pop(field, None)
    if case.path == "/v1/admin/workers" and is_int(body.get("workers")):
        body["workers"] = min(body["workers"], MAX_WORKERS)  # each one loads the model
    for field, limit in [*((f, MAX_TOKENS) for f in TOKEN_FIELDS), ("n", MAX_CHOICES)]:
        if is_int(body.get(field)) and body[field] > limit:
            body[field] = limit
    if case.method.upper() == "POST" and {"messages", "prompt"} & body.keys():
        ollama = case.path.startswith("/api/") and not case.path.startswith("/api/v0/")
        cap_generation(body, ollama=ollama)  # /api/v0: LM Studio's OpenAI bodies


def cap_generation(body: dict[str, Any], *, ollama: bool) -> None:
    """A missing or null token limit means "the whole context": set a small one."""
    if not ollama:
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = MAX_TOKENS
        return
    options = body.setdefault("options", {})
    if isinstance(options, dict):  # Ollama: num_predict < 0 means "no limit"
        value = options.get("num_predict")
        if value is None or (is_int(value) and not 0 <= value <= MAX_TOKENS):
            options["num_predict"] = MAX_TOKENS


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The admin API changes the server that every other test shares (a generated key would turn
# authentication on, a generated rate limit would throttle): tests/integration/security
# covers it on a server of its own.
# admin routes that change the served models (the other tests share the server)
SKIPPED_PREFIXES = ("/v1/admin/", "/api/delete/", "/api/copy/", "/api/create/", "/api/blobs/")


def operations(api_schema: Any) -> Iterator[Any]:  # Any: schemathesis' APIOperation
    """Every operation but the skipped ones; with WITH_ADMIN, those too, last."""
    skipped = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if not (operation.path + "/").startswith(SKIPPED_PREFIXES):
            yield operation
        else:
            skipped.append(operation)
    if WITH_ADMIN:
        yield from skipped


def takes_input(operation: Any) -> bool:
    definition = operation.definition.raw
    return bool(definition.get("parameters") or definition.get("requestBody"))


def run_operation(
    operation: Any,
    mode: GenerationMode,
    num_cases: int,
    base_url: str,
    model_id: str,
    statuses: Counter[str],
) -> None:
    """Send up to `num_cases` generated requests to one operation (counting their statuses in
    `statuses`); raises on the first failure."""

    @settings(
        max_examples=num_cases,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Case) -> None:
        clamp(case, model_id)
        response = case.call(base_url=base_url, timeout=REQUEST_TIMEOUT_S)
        statuses[f"{operation.label} {response.status_code}"] += 1
        case.validate_response(response, checks=CHECKS)

    # Unsatisfiable: nothing to generate in this mode (no parameters, or none can be invalid)
    with contextlib.suppress(Unsatisfiable):
        check()


def test_schemathesis_finds_no_failures(api_schema: Any, server_url: str) -> None:
    found = list(operations(api_schema))
    model_id = httpx.get(f"{server_url}/v1/models").json()["data"][0]["id"]
    assert any(operation.path == "/generate" for operation in found)
    # an operation without parameters or body has one request to send; the rest share the budget
    fixed = [op for op in found if not takes_input(op)]
    per_mode = max(MIN_CASES_PER_MODE, (MAX_CASES - len(fixed)) // (2 * (len(found) - len(fixed))))
    failures: list[str] = []
    statuses: Counter[str] = Counter()
    seconds: dict[str, float] = {}
    started = time.monotonic()
    for operation in found:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            began = time.monotonic()
            try:
                run_operation(operation, mode, per_mode, server_url, model_id, statuses)
            except Exception as exc:  # a check failed: report them all at the end
                failures.append(f"{operation.label} ({mode.value}):\n{exc}")
            seconds[f"{operation.label} {mode.value}"] = time.monotonic() - began
    total = sum(statuses.values())
    summary = "\n".join(f"  {key}: {count}" for key, count in sorted(statuses.items()))
    slowest = sorted(seconds.items(), key=lambda item: -item[1])[:5]
    summary += "\nslowest: " + ", ".join(f"{key} {s:.1f} s" for key, s in slowest)
    print(f"schemathesis: {total} requests in {time.monotonic() - started:.1f} s\n{summary}")  # noqa: T201
    assert not failures, "\n\n".join(failures)
    assert total <= MAX_CASES + 2 * len(found)
    assert statuses["POST /generate 200"] and statuses["POST /chat 200"]  # it generated
