"""Constrained decoding cost: the same prompts with and without a JSON-schema constraint.

The prompts and schemas are the structured-output contract corpus
(`tests/contract/schemas/*.json`, a seeded sample of `--cases` of them). For each model a
real `inferflux serve` is started (bench/launch.py); for each concurrency level the cases
run twice over streaming /v1/chat/completions, greedy, `max_tokens` each: once plain
("free") and once with `response_format: json_schema` ("json_schema"). The constrained run
goes first; the free run then asks each case for exactly as many tokens as its constrained
output had (`max_tokens` = that count, `ignore_eos`), so both runs decode the same token
counts with the same batch dynamics and prefill share, and only the constraint differs.
(Without that, free outputs run to max_tokens while constrained ones stop when the JSON
closes; closed-loop clients then start new requests sooner under the constraint, and the
extra prefill, not the constraint, dominates the difference at concurrency > 1.)

Per request:
    TTFT          send → first content chunk (includes compiling the schema when constrained)
    decode tok/s  (output tokens − 1) / (last content chunk − first content chunk): the tokens
                  after the first over the time they took (requests with < 2 tokens skipped)
Per configuration (model × concurrency × mode): mean and p50 of decode tok/s over
requests, aggregate tok/s (all output tokens / wall time), TTFT p50, how many outputs
stopped and how many parsed as JSON valid against the schema (no format checks here: the
contract test does that). Per model and level: overhead % = 1 − constrained / free
mean decode tok/s, and the TTFT p50 ratio.

    .venv/bin/python bench/constrained.py                                 # both models, 1 and 8
    .venv/bin/python bench/constrained.py --cases 16 --max-tokens 96 --models smollm2
    .venv/bin/python bench/constrained.py --json bench/results/constrained.json \\
        --markdown bench/results/constrained.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from launch import model_args, start_server
from workload import summarize

CORPUS_DIR = Path(__file__).resolve().parents[1] / "tests" / "contract" / "schemas"
SYSTEM = "You answer with JSON only."
MODES = ("json_schema", "free")  # free second: it copies the constrained lengths


@dataclass(slots=True)
class Sample:
    """One streamed request. Times in seconds from sending it."""

    name: str
    ok: bool = True
    error: str | None = None
    ttft_s: float | None = None
    last_s: float | None = None
    output_tokens: int = 0
    finish_reason: str | None = None
    schema_valid: bool | None = None

    @property
    def decode_tok_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.last_s is None or self.output_tokens < 2:
            return None
        span = self.last_s - self.ttft_s
        return (self.output_tokens - 1) / span if span > 0 else None


@dataclass(slots=True)
class Config:
    model: str
    concurrency: int
    mode: str
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0

    def report(self) -> dict[str, Any]:  # Any: JSON report
        ok = [s for s in self.samples if s.ok]
        rates = [r for s in ok if (r := s.decode_tok_s) is not None]
        tokens = sum(s.output_tokens for s in ok)
        return {
            "model": self.model,
            "concurrency": self.concurrency,
            "mode": self.mode,
            "num_requests": len(self.samples),
            "num_errors": len(self.samples) - len(ok),
            "num_stopped": sum(s.finish_reason == "stop" for s in ok),
            "num_schema_valid": sum(bool(s.schema_valid) for s in ok),
            "output_tokens": tokens,
            "wall_s": self.wall_s,
            "aggregate_tok_s": tokens / self.wall_s if self.wall_s > 0 else 0.0,
            "decode_tok_s": summarize(rates).as_dict(),
            "ttft_s": summarize([s.ttft_s for s in ok if s.ttft_s is not None]).as_dict(),
            "errors": [s.error for s in self.samples if not s.ok][:5],
            "requests": [asdict(s) for s in self.samples],
        }


def load_cases(n: int, seed: int) -> list[dict[str, Any]]:  # Any: JSON
    """A seeded sample of `n` corpus cases (all of them when n <= 0), in corpus order."""
    cases = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(CORPUS_DIR.glob("*.json"))]
    if 0 < n < len(cases):
        keep = set(random.Random(seed).sample(range(len(cases)), n))
        cases = [c for i, c in enumerate(cases) if i in keep]
    return cases


def build_body(
    case: dict[str, Any], mode: str, max_tokens: int, lengths: dict[str, int] | None = None
) -> dict[str, Any]:
    """The request; a free one with `lengths` asks for exactly the constrained length."""
    matched = mode == "free" and lengths is not None and case["name"] in lengths
    if matched:
        assert lengths is not None
        max_tokens = lengths[case["name"]]
    body: dict[str, Any] = {  # Any: JSON body
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": case["prompt"]},
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if matched:
        body["ignore_eos"] = True
    if mode == "json_schema":
        schema = {"name": case["name"], "schema": case["schema"], "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    return body


def _fold(sample: Sample, event: dict[str, Any], sent_at: float, text: list[str]) -> None:
    if "error" in event:
        sample.ok, sample.error = False, json.dumps(event["error"])[:200]
        return
    for choice in event.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content")
        if piece:
            now = time.perf_counter() - sent_at
            sample.ttft_s = now if sample.ttft_s is None else sample.ttft_s
            sample.last_s = now
            text.append(piece)
        sample.finish_reason = choice.get("finish_reason") or sample.finish_reason
    if event.get("usage"):
        sample.output_tokens = int(event["usage"]["completion_tokens"])


async def stream_case(
    client: httpx.AsyncClient,
    case: dict[str, Any],
    mode: str,
    max_tokens: int,
    lengths: dict[str, int] | None = None,
) -> Sample:
    """One streamed request, timed; never raises for server faults."""
    sample, text = Sample(case["name"]), []
    sent_at = time.perf_counter()
    try:
        body = build_body(case, mode, max_tokens, lengths)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode("utf-8", "replace")[:200]
                sample.ok, sample.error = False, f"HTTP {response.status_code}: {detail}"
                return sample
            async for line in response.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    _fold(sample, json.loads(line[5:]), sent_at, text)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        sample.ok, sample.error = False, f"{type(exc).__name__}: {exc}"
    sample.schema_valid = _schema_valid(case["schema"], "".join(text))
    return sample


def _schema_valid(schema: dict[str, Any], text: str) -> bool:
    try:
        return bool(Draft202012Validator(schema).is_valid(json.loads(text)))
    except json.JSONDecodeError:
        return False


async def run_config(
    client: httpx.AsyncClient,
    config: Config,
    cases: list[dict[str, Any]],
    max_tokens: int,
    lengths: dict[str, int] | None = None,
) -> Config:
    """`config.concurrency` closed-loop clients share the cases; fills samples and wall_s."""

    async def client_loop(share: list[dict[str, Any]]) -> list[Sample]:
        return [await stream_case(client, c, config.mode, max_tokens, lengths) for c in share]

    if len(cases) < config.concurrency:  # every client gets work: the level is real
        cases = cases * -(-config.concurrency // len(cases))
    started = time.perf_counter()
    shares = [cases[i :: config.concurrency] for i in range(config.concurrency)]
    batches = await asyncio.gather(*(client_loop(share) for share in shares))
    config.wall_s = time.perf_counter() - started
    config.samples = [s for batch in batches for s in batch]
    return config


async def run_url(
    url: str,
    config: Config,
    cases: list[dict[str, Any]],
    max_tokens: int,
    lengths: dict[str, int] | None = None,
) -> Config:
    limits = httpx.Limits(max_connections=config.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        return await run_config(client, config, cases, max_tokens, lengths)


def overhead_rows(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and level: constrained vs free mean decode tok/s and TTFT p50."""
    by_key = {(r["model"], r["concurrency"], r["mode"]): r for r in reports}
    rows = []
    for (model, level, mode), free in by_key.items():
        constrained = by_key.get((model, level, "json_schema"))
        if mode != "free" or constrained is None:
            continue
        f_rate, c_rate = free["decode_tok_s"]["mean"], constrained["decode_tok_s"]["mean"]
        f_ttft, c_ttft = free["ttft_s"]["p50"], constrained["ttft_s"]["p50"]
        rows.append(
            {
                "model": model,
                "concurrency": level,
                "free_decode_tok_s": f_rate,
                "json_schema_decode_tok_s": c_rate,
                "decode_overhead_pct": 100 * (1 - c_rate / f_rate) if f_rate and c_rate else None,
                "ttft_p50_ratio": c_ttft / f_ttft if f_ttft and c_ttft else None,
            }
        )
    return rows


def _f(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def markdown(reports: list[dict[str, Any]], rows: list[dict[str, Any]], note: str) -> str:
    lines = [
        note,
        "",
        "| model | conc | mode | reqs | errors | stopped | schema-valid | decode tok/s mean "
        "| decode tok/s p50 | aggregate tok/s | TTFT p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in reports:
        cells = [
            r["model"], str(r["concurrency"]), r["mode"], str(r["num_requests"]),
            str(r["num_errors"]), str(r["num_stopped"]), str(r["num_schema_valid"]),
            _f(r["decode_tok_s"]["mean"]), _f(r["decode_tok_s"]["p50"]),
            _f(r["aggregate_tok_s"]), _f(r["ttft_s"]["p50"], 1000, 0),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model | conc | free decode tok/s | json_schema decode tok/s | decode overhead "
        "| TTFT p50 json_schema / free |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        cells = [
            row["model"], str(row["concurrency"]), _f(row["free_decode_tok_s"]),
            _f(row["json_schema_decode_tok_s"]), _f(row["decode_overhead_pct"]) + " %",
            _f(row["ttft_p50_ratio"], digits=2) + "×",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bench_model(model: str, args: argparse.Namespace, cases: list[dict[str, Any]]) -> list[Config]:
    server = start_server(args.port, model_args(model), {"INFERFLUX_MODEL__CTX_SIZE": "1024"})
    url = f"http://127.0.0.1:{args.port}"
    done: list[Config] = []
    try:
        for mode in MODES:  # warm-up: load the paths, compile one schema
            asyncio.run(run_url(url, Config(model, 1, mode), cases[:1], 8))
        for level in args.concurrency:
            lengths: dict[str, int] | None = None
            for mode in MODES:
                config = asyncio.run(
                    run_url(url, Config(model, level, mode), cases, args.max_tokens, lengths)
                )
                lengths = {s.name: s.output_tokens for s in config.samples if s.output_tokens}
                report = config.report()
                print(
                    f"{model} c={level} {mode}: decode mean "
                    f"{_f(report['decode_tok_s']['mean'])} tok/s, aggregate "
                    f"{_f(report['aggregate_tok_s'])} tok/s, TTFT p50 "
                    f"{_f(report['ttft_s']['p50'], 1000, 0)} ms, errors {report['num_errors']}",
                    flush=True,
                )
                done.append(config)
    finally:
        server.terminate()
        server.wait(30)
    return done


def _levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers like 1,8: {text!r}")
    return levels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2,gemma", help="smollm2, gemma or GGUF paths")
    p.add_argument("--concurrency", type=_levels, default=[1, 8])
    p.add_argument("--cases", type=int, default=32, help="corpus cases per configuration")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=18282)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args(argv)
    cases = load_cases(args.cases, args.seed)
    configs = [c for m in args.models.split(",") for c in bench_model(m.strip(), args, cases)]
    reports = [c.report() for c in configs]
    rows = overhead_rows(reports)
    note = (
        f"constrained.py: {len(cases)} corpus cases per configuration, max_tokens "
        f"{args.max_tokens}, greedy, streaming chat; seed {args.seed}"
    )
    table = markdown(reports, rows, note)
    print("\n" + table)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table, encoding="utf-8")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"config": {k: str(v) for k, v in vars(args).items()}, "overhead": rows}
        data["configurations"] = reports
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 1 if any(r["num_errors"] for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
