"""Does DRY inside a JSON-schema constraint raise the schema-valid rate of small models?

The structured-output contract corpus (`tests/contract/schemas/`, every case), through a
real `inferflux serve` per model, greedy, `max_tokens` 256, concurrency 8 (the settings of
`tests/integration/test_structured_contract.py`), once per sampler configuration:

    off          no DRY (today's default)
    dry          dry_multiplier 0.8, base 1.75, allowed_length 2, llama.cpp's default
                 sequence breakers ("\\n", ":", "\\"", "*")
    dry-json     the same with JSON's punctuation as breakers too (",", "{", "}", "[", "]"):
                 a repeated key (`"name": ... , "name":`) is broken into short runs that DRY
                 never penalizes, while a value that repeats itself does not contain them

Each answer is judged by the contract's validator: `valid` (stopped, and JSON that
satisfies the schema), `length` (cut by max_tokens: greedy repetition), `invalid` (stopped
but not valid: must stay 0, the constraint guarantees it), `refused` (HTTP error). Also
the completion tokens and the wall time per configuration.

    .venv/bin/python bench/dry_json.py                       # both models, all configs
    .venv/bin/python bench/dry_json.py --models smollm2 --json bench/results/dry_json.json \\
        --markdown bench/results/dry_json.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from launch import kill_group, model_args, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the contract corpus

from tests.contract.corpus import ContractCase, judge_output, load_corpus  # noqa: E402

SYSTEM = "You answer with JSON only."
DRY = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2}
CONFIGS: dict[str, dict[str, Any]] = {
    "off": {},
    "dry": {**DRY, "dry_sequence_breakers": ["\n", ":", '"', "*"]},
    "dry-json": {**DRY, "dry_sequence_breakers": ["\n", ":", '"', "*", ",", "{", "}", "[", "]"]},
}


@dataclass(slots=True)
class Run:
    """One model × configuration over the whole corpus."""

    model: str
    config: str
    valid: int = 0
    length: int = 0
    invalid: int = 0
    refused: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    not_valid: list[str] | None = None

    @property
    def total(self) -> int:
        return self.valid + self.length + self.invalid + self.refused


async def _ask(
    client: httpx.AsyncClient, case: ContractCase, extra: dict[str, Any], max_tokens: int
) -> tuple[str, int]:
    """(category, completion tokens) of one case."""
    body = {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": case.prompt},
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": case.name, "schema": case.schema, "strict": True},
        },
        **extra,
    }
    response = await client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        return "refused", 0
    data = response.json()
    choice = data["choices"][0]
    tokens = int(data["usage"]["completion_tokens"])
    if judge_output(case.schema, choice["message"]["content"] or "") is None:
        return "valid", tokens
    return ("length" if choice["finish_reason"] == "length" else "invalid"), tokens


async def run_config(
    url: str, run: Run, cases: list[ContractCase], args: argparse.Namespace
) -> Run:
    gate = asyncio.Semaphore(args.concurrency)
    extra = CONFIGS[run.config]

    async def one(client: httpx.AsyncClient, case: ContractCase) -> tuple[str, str, int]:
        async with gate:
            category, tokens = await _ask(client, case, extra, args.max_tokens)
            return case.name, category, tokens

    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        results = await asyncio.gather(*(one(client, case) for case in cases))
    run.wall_s = time.monotonic() - started
    run.not_valid = sorted(
        f"{name}:{category}" for name, category, _ in results if category != "valid"
    )
    for _, category, tokens in results:
        setattr(run, category, getattr(run, category) + 1)
        run.completion_tokens += tokens
    return run


def bench_model(model: str, cases: list[ContractCase], args: argparse.Namespace) -> list[Run]:
    server = start_server(args.port, model_args(model))
    url = f"http://127.0.0.1:{args.port}"
    runs = []
    try:
        for config in args.configs:
            run = asyncio.run(run_config(url, Run(model, config), cases, args))
            print(
                f"{model} {config}: {run.valid}/{run.total} valid, {run.length} length, "
                f"{run.invalid} invalid, {run.refused} refused, {run.completion_tokens} tokens "
                f"in {run.wall_s:.1f} s",
                flush=True,
            )
            runs.append(run)
    finally:
        kill_group(server)
    return runs


def markdown(runs: list[Run]) -> str:
    lines = [
        "| model | sampler | valid | cut by max_tokens | invalid passed off | refused | "
        "completion tokens | wall |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        lines.append(
            f"| {run.model} | {run.config} | {run.valid}/{run.total} "
            f"({run.valid / max(run.total, 1):.1%}) | {run.length} | {run.invalid} | "
            f"{run.refused} | {run.completion_tokens} | {run.wall_s:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2,gemma", help="smollm2, gemma or GGUF paths")
    p.add_argument("--configs", default=",".join(CONFIGS), help="of: " + ", ".join(CONFIGS))
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--port", type=int, default=18431)
    p.add_argument("--json", type=Path, help="write the runs as JSON here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        p.error(f"unknown configs {sorted(unknown)}; use {sorted(CONFIGS)}")
    cases = load_corpus()
    runs = [run for m in args.models.split(",") for run in bench_model(m.strip(), cases, args)]
    table = markdown(runs)
    print(table)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
