"""The structured-output contract, end to end: every corpus schema through the real server
with both test models (SmolLM2-135M-Instruct, Gemma 3 270M), judged by jsonschema here.

The contract (issue 5): with `response_format` json_schema, generation is constrained
token by token, and each choice carries `structured_output: {valid, error}`. An output that
stopped on its own is JSON that satisfies the schema; an output cut by max_tokens has
finish_reason "length" and valid false; a schema the server cannot compile or that exceeds
its limits is refused with 400 (never served unconstrained). Those are asserted exactly.

The spec's KPI is 99.5% valid responses. These two tiny models do not reach it: greedy
decoding sometimes degenerates into repetition (`0.99999…`, `1000000…`, one sentence over
and over) until max_tokens, which the contract reports as `length`, valid false. Measured
(BENCHMARKS.md): SmolLM2 169/170, Gemma 161/170, never an invalid answer passed off as
complete. So each model has a floor below its measured rate (greedy outputs shift with
batch composition), a regression check, and the per-model figures are printed in the
"structured output compliance" section at the end of the pytest run.

`make test` runs a sample of the corpus (`corpus.sample`: every third schema, plus one
for each feature none of those uses; 66 of 170) with floors that allow for the smaller
sample: the whole corpus on both models took about 250 s of the suite. `make contract`
(`INFERFLUX_CONTRACT_FULL=1`) runs all of it with the measured floors; run it after a
change to the grammar engine, the sampler or the contract.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.contract.corpus import ContractCase, judge_output, load_corpus, sample
from tests.integration.server_process import ServerProcess
from tests.openai_envelope import assert_envelope

pytestmark = [pytest.mark.model, pytest.mark.server, pytest.mark.timeout(900)]

FULL = os.environ.get("INFERFLUX_CONTRACT_FULL", "") not in ("", "0")
CORPUS = load_corpus()
CASES = CORPUS if FULL else sample(CORPUS)
MODELS = ("smollm2", "gemma")
MAX_TOKENS = 256
CONCURRENCY = 8
KPI_VALID_RATIO = 0.995  # the spec's target, reported, not asserted (module docstring)
# Measured on the whole corpus: SmolLM2 169/170, Gemma 161/170 (BENCHMARKS.md). On the
# sample, floors that allow 3 and 9 misses of 66 (the whole corpus' rates predict 0.4, 3.5).
MIN_VALID_RATIO = {"smollm2": 0.97, "gemma": 0.9} if FULL else {"smollm2": 0.94, "gemma": 0.85}
SYSTEM = "You answer with JSON only."


@dataclass(frozen=True, slots=True)
class Outcome:
    """One corpus request as the test saw it."""

    name: str
    status: int
    finish_reason: str | None = None
    text: str = ""
    structured_output: Any = None  # Any: the JSON object the server sent, checked below
    own_error: str | None = None  # this test's verdict: None = JSON that satisfies the schema
    completion_tokens: int = 0
    body: str = ""

    @property
    def valid(self) -> bool:
        return self.status == 200 and self.own_error is None

    def describe(self) -> str:
        return (
            f"{self.name}: HTTP {self.status} finish={self.finish_reason} "
            f"server={self.structured_output} own={self.own_error} text={self.text[:160]!r}"
            + (f" body={self.body[:300]}" if self.status != 200 else "")
        )


@dataclass(frozen=True, slots=True)
class CorpusRun:
    model: str
    outcomes: list[Outcome]
    wall_s: float

    def summary(self) -> str:
        counts = {"valid": 0, "length": 0, "invalid": 0, "refused": 0}
        for o in self.outcomes:
            counts[_category(o)] += 1
        tokens = sum(o.completion_tokens for o in self.outcomes)
        cut = sorted(o.name for o in self.outcomes if _category(o) != "valid")
        ratio = counts["valid"] / max(len(self.outcomes), 1)
        kpi = "met" if ratio >= KPI_VALID_RATIO else "missed"
        return (
            f"{self.model}: {len(self.outcomes)} schemas in {self.wall_s:.1f} s "
            f"(max_tokens {MAX_TOKENS}, concurrency {CONCURRENCY}, {tokens} completion tokens): "
            f"{ratio:.1%} valid (KPI {KPI_VALID_RATIO:.1%} {kpi}): "
            + ", ".join(f"{k} {v}" for k, v in counts.items())
            + (f"; not valid: {', '.join(cut)}" if cut else "")
        )


def _category(outcome: Outcome) -> str:
    if outcome.status != 200:
        return "refused"
    if outcome.valid:
        return "valid"
    return "length" if outcome.finish_reason == "length" else "invalid"


def json_schema_format(case: ContractCase) -> dict[str, Any]:  # Any: JSON
    return {
        "type": "json_schema",
        "json_schema": {"name": case.name, "schema": case.schema, "strict": True},
    }


async def _ask(client: httpx.AsyncClient, model_id: str, case: ContractCase) -> Outcome:
    body = {
        "model": model_id,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": case.prompt},
        ],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "response_format": json_schema_format(case),
    }
    response = await client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        return Outcome(case.name, response.status_code, body=response.text)
    data = response.json()
    choice = data["choices"][0]
    text = choice["message"]["content"] or ""
    return Outcome(
        name=case.name,
        status=200,
        finish_reason=choice["finish_reason"],
        text=text,
        structured_output=choice.get("structured_output"),
        own_error=judge_output(case.schema, text),
        completion_tokens=int(data["usage"]["completion_tokens"]),
    )


async def run_corpus(url: str, model_id: str) -> tuple[list[Outcome], float]:
    """Every case, CONCURRENCY at a time; the outcomes in corpus order and the wall time."""
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY)

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(case: ContractCase) -> Outcome:
            async with gate:
                return await _ask(client, model_id, case)

        started = time.monotonic()
        outcomes = await asyncio.gather(*(one(case) for case in CASES))
        return list(outcomes), time.monotonic() - started


class ComplianceReport:
    """A pytest plugin that prints each model's figures in the terminal summary."""

    name = "structured-output-compliance"

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:  # Any: pytest internal
        terminalreporter.section("structured output compliance")
        for line in self.lines:
            terminalreporter.write_line(line)


def _report(config: pytest.Config) -> ComplianceReport:
    plugin = config.pluginmanager.get_plugin(ComplianceReport.name)
    if plugin is None:
        plugin = ComplianceReport()
        config.pluginmanager.register(plugin, ComplianceReport.name)
    assert isinstance(plugin, ComplianceReport)
    return plugin


def _model_id(url: str) -> str:
    return str(httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"])


def _run(url: str, model: str, config: pytest.Config) -> CorpusRun:
    # NOTE: a thread of its own, so asyncio.run never touches pytest-asyncio's loop
    with ThreadPoolExecutor(1) as pool:
        outcomes, wall_s = pool.submit(asyncio.run, run_corpus(url, _model_id(url))).result()
    run = CorpusRun(model, outcomes, wall_s)
    _report(config).lines.append(run.summary())
    return run


@pytest.fixture(scope="module")
def smollm2_run(server_url: str, pytestconfig: pytest.Config) -> CorpusRun:
    return _run(server_url, "smollm2", pytestconfig)


@pytest.fixture(scope="module")
def gemma_run(
    gemma3_model_path: str, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[CorpusRun]:
    log = tmp_path_factory.mktemp("log") / "gemma-structured.log"
    args = ("--model", gemma3_model_path, "--model-id", "gemma-3-270m")
    proc = ServerProcess(*args, env={"INFERFLUX_MODEL__CTX_SIZE": "1024"}, log_path=log)
    try:
        proc.wait_ready()
        yield _run(proc.url, "gemma", pytestconfig)
    finally:
        proc.close()


@pytest.fixture(params=MODELS)
def corpus_run(request: pytest.FixtureRequest) -> CorpusRun:
    run = request.getfixturevalue(f"{request.param}_run")
    assert isinstance(run, CorpusRun)
    return run


def test_no_corpus_schema_is_refused(corpus_run: CorpusRun) -> None:
    refused = [o.describe() for o in corpus_run.outcomes if o.status != 200]
    assert not refused, "\n".join(refused)


def test_every_choice_carries_a_structured_output_verdict(corpus_run: CorpusRun) -> None:
    for o in corpus_run.outcomes:
        if o.status != 200:
            continue
        verdict = o.structured_output
        assert isinstance(verdict, dict) and set(verdict) == {"valid", "error"}, o.describe()
        assert isinstance(verdict["valid"], bool), o.describe()
        if verdict["valid"]:
            assert verdict["error"] is None, o.describe()
        else:
            assert isinstance(verdict["error"], str) and verdict["error"], o.describe()


def test_outputs_that_stopped_are_json_satisfying_the_schema(corpus_run: CorpusRun) -> None:
    stopped = [o for o in corpus_run.outcomes if o.finish_reason == "stop"]
    assert stopped
    broken = [o.describe() for o in stopped if o.own_error is not None]
    assert not broken, "\n".join(broken)
    assert all(o.structured_output["valid"] is True for o in stopped)


def test_every_invalid_output_was_cut_by_max_tokens_and_flagged(corpus_run: CorpusRun) -> None:
    invalid = [o for o in corpus_run.outcomes if o.status == 200 and not o.valid]
    wrong = [
        o.describe()
        for o in invalid
        if o.finish_reason != "length" or o.structured_output["valid"] is not False
    ]
    assert not wrong, "\n".join(wrong)
    for o in invalid:
        assert o.completion_tokens == MAX_TOKENS, o.describe()


def test_outputs_cut_by_max_tokens_are_flagged_invalid(corpus_run: CorpusRun) -> None:
    cut = [o for o in corpus_run.outcomes if o.finish_reason == "length"]
    assert all(o.structured_output["valid"] is False for o in cut), [o.describe() for o in cut]
    assert all(
        o.finish_reason in ("stop", "length") for o in corpus_run.outcomes if o.status == 200
    )


def test_the_valid_ratio_stays_above_each_models_floor(corpus_run: CorpusRun) -> None:
    outcomes = corpus_run.outcomes
    valid = sum(o.valid for o in outcomes)
    not_valid = [o.describe() for o in outcomes if not o.valid]
    floor = MIN_VALID_RATIO[corpus_run.model]
    assert valid / len(outcomes) >= floor, "\n".join(not_valid)


# --- json_object, /v1/completions, and schemas the server must refuse (SmolLM2 server) ---

JSON_OBJECT_PROMPTS = (
    "Describe Bob, who is 25 years old, with a name and an age.",
    "Give the weather in Rome: sunny, 28 degrees.",
    "List two colors under the key colors.",
)


def _check_verdict(choice: dict[str, Any], text: str, schema: dict[str, Any] | None) -> None:
    """stop → JSON (satisfying `schema` if given) and valid; length → valid false."""
    verdict = choice["structured_output"]
    assert choice["finish_reason"] in ("stop", "length"), choice
    if choice["finish_reason"] == "length":
        assert verdict["valid"] is False and verdict["error"], choice
        return
    assert verdict == {"valid": True, "error": None}, choice
    instance = json.loads(text)
    assert isinstance(instance, dict) if schema is None else judge_output(schema, text) is None


@pytest.fixture(scope="module")
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("prompt", JSON_OBJECT_PROMPTS)
def test_json_object_gives_a_json_object(http: httpx.Client, prompt: str) -> None:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 96,
        "response_format": {"type": "json_object"},
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    _check_verdict(choice, choice["message"]["content"], None)


def test_json_object_on_completions(http: httpx.Client) -> None:
    body = {
        "prompt": "A JSON object describing a cat named Tom:",
        "temperature": 0,
        "max_tokens": 96,
        "response_format": {"type": "json_object"},
    }
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    _check_verdict(choice, choice["text"], None)


COMPLETION_CASES = [c for c in CORPUS if c.name in ("book", "sentiment_label", "ref_invoice_lines")]


@pytest.mark.parametrize("case", COMPLETION_CASES, ids=[c.name for c in COMPLETION_CASES])
def test_json_schema_on_completions(http: httpx.Client, case: ContractCase) -> None:
    body = {
        "prompt": f"{case.prompt}\nJSON:",
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "response_format": json_schema_format(case),
    }
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    _check_verdict(choice, choice["text"], case.schema)


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_an_output_cut_by_max_tokens_is_length_and_not_valid(
    http: httpx.Client, endpoint: str
) -> None:
    case = next(c for c in CORPUS if c.name == "order_full")
    body: dict[str, Any] = {
        "max_tokens": 6,
        "temperature": 0,
        "response_format": json_schema_format(case),
    }
    if endpoint == "/v1/completions":
        body["prompt"] = case.prompt
    else:
        body["messages"] = [{"role": "user", "content": case.prompt}]
    response = http.post(endpoint, json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["structured_output"]["valid"] is False
    assert choice["structured_output"]["error"]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    assert text.startswith("{") and judge_output(case.schema, text) is not None


def _nested(depth: int) -> dict[str, Any]:  # Any: JSON
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _oversize() -> dict[str, Any]:  # Any: JSON; about 2 MB, under the 4 MiB body limit
    props = {f"field_{k:05d}": {"type": "string", "maxLength": 8} for k in range(40_000)}
    return {"type": "object", "properties": props}


REFUSED = {
    "lookbehind_pattern": {"type": "string", "pattern": "(?<=a)b"},
    "missing_ref": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    "unknown_format": {"type": "string", "format": "credit-card-number"},
    "not_a_schema": {"type": "strnig"},
    "too_deep": _nested(200),
    "oversize": _oversize(),
}


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("problem", list(REFUSED))
def test_schemas_the_server_cannot_honour_are_refused_with_400(
    http: httpx.Client, endpoint: str, problem: str
) -> None:
    body: dict[str, Any] = {
        "max_tokens": 8,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": problem, "schema": REFUSED[problem], "strict": True},
        },
    }
    if endpoint == "/v1/completions":
        body["prompt"] = "JSON:"
    else:
        body["messages"] = [{"role": "user", "content": "JSON please."}]
    error = assert_envelope(http.post(endpoint, json=body), 400)
    assert error["param"] is None or str(error["param"]).startswith("response_format"), error


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_schema"}, {"type": "yaml"}, {"type": "json_schema", "json_schema": []}],
)
def test_malformed_response_format_is_refused_with_400(
    http: httpx.Client, response_format: dict[str, Any]
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": response_format}
    assert_envelope(http.post("/v1/chat/completions", json=body), 400)
