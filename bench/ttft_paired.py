"""Time to first token at c = 1, paired, and where it goes: InferFlux against llama-server
with both servers up at once and each prompt sent to one, then the other (the order
alternating), so a VM whose speed drifts reaches both alike.

    INFERFLUX_COMPARE_CACHE=/work/cache-compare .venv/bin/python bench/ttft_paired.py \\
        --models smollm2,gemma3 --prompts 12 --rounds 2

The prompts are the comparison's stream workload (`compare/workloads.py`: 45–320 words,
seeded), each with a tag of its round in front so that no server serves it from KV an
earlier round left. Every request streams `--max-tokens` tokens, greedy.

Per request it records the client's TTFT (request sent → first content chunk) and each
server's own account of the prompt:

- llama-server: `timings.prompt_ms` (its prompt's decode) and `prompt_n`;
- InferFlux: `/debug/requests` (admin; open with authentication off): the engine's time
  from receiving the request to the first token (`engine_time_to_first_token_s`), of which
  `engine_prefill_s` is from scheduling to the first token, and the API's own TTFT.

So the client's TTFT splits into the prompt's compute and everything else (HTTP, template,
tokenizing, the hop to the worker, queueing, the first chunk's way back), side by side.
Results: bench/results/ttft_paired.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from typing import Any

import httpx

from compare import toolchain
from compare.models import MODELS, load_model
from compare.runner import variant_envs
from compare.servers import Toolchain, make_server, running
from compare.workloads import MAX_WORDS, MIN_WORDS
from speculative import LOGS, RESULTS, write_results
from workload import make_prompts

Row = dict[str, Any]  # Any: JSON
LLAMA = "llama-server"


def _stream(url: str, prompt: str, max_tokens: int) -> tuple[float, dict[str, Any]]:
    """(seconds to the first content chunk, llama-server's `timings` or {})."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    first: float | None = None
    timings: dict[str, Any] = {}
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.perf_counter() - started
            timings = chunk.get("timings") or timings
    if first is None:
        raise RuntimeError(f"{url}: no content in the stream")
    return first, timings


def _inferflux_phases(url: str) -> dict[str, Any]:
    recent = httpx.get(f"{url}/debug/requests", timeout=30).json()["recent"]
    return recent[0] if recent else {}


def run_model(key: str, tools: Toolchain, args: Any) -> list[Row]:
    model = load_model(key)
    configs = [LLAMA, *args.configs]
    rows: list[Row] = []
    prompts = make_prompts(args.prompts, args.seed, MIN_WORDS, MAX_WORDS)
    with ExitStack() as stack:
        urls = {}
        for i, config in enumerate(configs):
            base = make_server(
                LLAMA if config == LLAMA else "inferflux", tools, model, args.port + i, 1
            )
            env = {**base.env, **args.variants.get(config, {})}
            server = type(base)(config, base.argv, base.ready_path, env, base.ignore_eos)
            log = LOGS / f"ttft-paired-{key}-{config}.log"
            urls[config] = stack.enter_context(running(server, args.port + i, log)).url
        for url in urls.values():
            _stream(url, "Say hello.", 2)  # warm
        turn = 0
        for round_ in range(args.rounds):
            for index, prompt in enumerate(prompts):
                tagged = f"Request {round_ + 1}.{index + 1}. {prompt}"
                k = turn % len(configs)
                for config in configs[k:] + configs[:k]:
                    ttft, timings = _stream(urls[config], tagged, args.max_tokens)
                    row: Row = {"model": key, "config": config, "round": round_, "prompt": index}
                    row["ttft_ms"] = round(ttft * 1000, 2)
                    if config == LLAMA:
                        row["prompt_tokens"] = timings.get("prompt_n")
                        row["compute_ms"] = timings.get("prompt_ms")
                    else:
                        phases = _inferflux_phases(urls[config])
                        row["prompt_tokens"] = phases.get("num_prompt_tokens")
                        row["cached_tokens"] = phases.get("num_cached_tokens")
                        row["compute_ms"] = _ms(phases.get("engine_prefill_s"))
                        row["engine_ttft_ms"] = _ms(phases.get("engine_time_to_first_token_s"))
                        row["api_ttft_ms"] = _ms(phases.get("time_to_first_token_s"))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                turn += 1
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def summarize(rows: list[Row]) -> list[Row]:
    """Per (model, config): medians of TTFT, compute and the rest, and the medians of the
    per-prompt ratios to llama-server's."""
    ref = {(r["model"], r["round"], r["prompt"]): r for r in rows if r["config"] == LLAMA}
    out: list[Row] = []
    for key in sorted({(r["model"], r["config"]) for r in rows}, key=lambda k: k[1] != LLAMA):
        mine = [r for r in rows if (r["model"], r["config"]) == key]
        pairs = [(r, ref[(r["model"], r["round"], r["prompt"])]) for r in mine]
        computed = [r for r in mine if r.get("compute_ms") is not None]
        out.append(
            {
                "model": key[0],
                "config": key[1],
                "requests": len(mine),
                "ttft_ms_p50": _median([r["ttft_ms"] for r in mine]),
                "ttft_ms_mean": round(statistics.fmean(r["ttft_ms"] for r in mine), 1),
                "compute_ms_p50": _median([r["compute_ms"] for r in computed]),
                "rest_ms_p50": _median([r["ttft_ms"] - r["compute_ms"] for r in computed]),
                "ttft_ratio_p50": _median([a["ttft_ms"] / b["ttft_ms"] for a, b in pairs]),
                "compute_ratio_p50": _median(
                    [
                        a["compute_ms"] / b["compute_ms"]
                        for a, b in pairs
                        if a.get("compute_ms") and b.get("compute_ms")
                    ]
                ),
            }
        )
    return out


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def markdown(summary: list[Row]) -> str:
    lines = [
        "| model | config | requests | TTFT p50 ms (mean) | prompt compute p50 ms "
        "| the rest p50 ms | TTFT ÷ llama-server, p50 of pairs | compute ÷ llama-server |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for s in summary:
        lines.append(
            f"| {s['model']} | {s['config']} | {s['requests']} | {s['ttft_ms_p50']} "
            f"({s['ttft_ms_mean']}) | {s['compute_ms_p50']} | {s['rest_ms_p50']} "
            f"| {s['ttft_ratio_p50']} | {s['compute_ratio_p50']} |"
        )
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default="inferflux", help="InferFlux configs beside llama-server")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:ENV=V,...: an InferFlux config with these settings (name it in --configs)",
    )
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=18471)
    p.add_argument("--out", default=str(RESULTS / "ttft_paired"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.variants = variant_envs(args.variant)
    args.configs = [c for c in args.configs.split(",") if c]
    tools = Toolchain(toolchain.llama_server().binary, None)
    rows = [row for key in args.models.split(",") for row in run_model(key, tools, args)]
    summary = summarize(rows)
    payload = {"command": " ".join(sys.argv), "rows": rows, "summary": summary}
    write_results(args.out, payload, markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
