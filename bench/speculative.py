"""Speculative decoding, side by side: InferFlux off / on / on-wide and llama-server's
speculative modes, on copy-heavy and free-form chat workloads, both models, c = 1, 4, 8.

    INFERFLUX_COMPARE_CACHE=/work/cache-compare .venv/bin/python bench/speculative.py
    # smoke: one model, one level, a few tokens
    INFERFLUX_COMPARE_CACHE=/work/cache-compare .venv/bin/python bench/speculative.py \\
        --models smollm2 --levels 1 --per-client 1 --max-tokens 16 \\
        --configs inferflux-off,inferflux-on,llama-server-ngram-simple

Workloads (greedy, `max_tokens`, the model may stop early; tok/s = completion tokens /
wall time of the level, all clients together):
- `edit`:  a code file of this repository and "output the whole file with <name> renamed";
- `quote`: a document (README sections) and a question answered by quoting it;
  both read bench/data/speculative_inputs.json (frozen copies: editing the source files
  or the README does not change the workload);
- `chat`:  free-form questions (nothing to copy).

Configs: `inferflux-off` (runtime.speculative_decoding.enabled false), `inferflux-on`
(the defaults), `inferflux-on-wide` (max_batch 16: no batch-size gate, goodput gate only),
`inferflux-on-cheap` (the goodput gate's row costs at 0.2 / 0.1: drafts almost always),
`inferflux-draft` (mode draft, `--draft-model`, default the model itself: mechanics only),
`llama-server` (no speculation) and `llama-server-<type>` for each `--spec-type` this
build lists (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache) and
`llama-server-draft` (draft-simple with the model as its own draft: the only pair that
exists here; it shows the mechanism's cost, not a real draft's gain). Each server is
started once per model (and round: `--rounds N` runs the configs N times, alternated, and
reports the mean with the range) with 8 sequences. `--variant NAME:ENV=VALUE[,…]` adds a config
`inferflux-NAME`: speculation on plus those settings, e.g. `--variant
k32:INFERFLUX_SPEC_CHUNK_SIZE=32`. Results: bench/results/speculative.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from compare import toolchain
from compare.models import MODELS, load_model
from compare.runner import variant_envs
from compare.servers import Model, Server, Toolchain, make_server, running

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
LOGS = toolchain.CACHE / "logs"
PARALLEL = 8
LLAMA_SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
CONFIGS = (
    "inferflux-off",
    "inferflux-on",
    "inferflux-on-wide",
    "inferflux-on-cheap",
    "inferflux-draft",
    "llama-server",
    *(f"llama-server-{t}" for t in LLAMA_SPEC_TYPES),
    "llama-server-draft",
)
WORKLOADS = ("edit", "quote", "chat")
# the copy-heavy inputs, frozen: source files and README sections of commit ab183bd
INPUTS = REPO / "bench" / "data" / "speculative_inputs.json"
_QUESTIONS = (
    "Write a short story about a fox who learns to fly.",
    "Explain how a refrigerator works.",
    "What are the benefits of regular exercise?",
    "Describe a day in the life of a baker.",
    "Why is the sky blue?",
    "Give advice to someone learning to program.",
    "Tell me about the history of Rome.",
    "How do plants grow from seeds?",
)


def _prompts(workload: str) -> list[str]:
    if workload == "chat":
        return list(_QUESTIONS)
    inputs = json.loads(INPUTS.read_text(encoding="utf-8"))
    if workload == "edit":
        return [
            f"```python\n{edit['code']}\n```\n\nOutput the whole file above again, unchanged "
            f"except that `{edit['old']}` is renamed to `{edit['new']}` everywhere."
            for edit in inputs["edit"]
        ]
    return [
        f"Document:\n{doc}\n\nQuote the first two paragraphs of the document word for "
        "word, then say which one is longer."
        for doc in inputs["quote"]
    ]


def _server(
    config: str,
    tools: Toolchain,
    model: Model,
    port: int,
    draft: str | None,
    variants: dict[str, dict[str, str]] | None = None,
) -> Server:
    if config.startswith("inferflux"):
        base = make_server("inferflux", tools, model, port, PARALLEL)
        env = dict(base.env)
        env["INFERFLUX_SPECULATIVE_ENABLED"] = "false" if config == "inferflux-off" else "true"
        env.update((variants or {}).get(config, {}))  # --variant: speculation on, plus these
        if config == "inferflux-on-wide":
            env["INFERFLUX_RUNTIME__SPECULATIVE_DECODING__MAX_BATCH"] = "16"
        if config == "inferflux-on-cheap":  # the goodput gate told rows cost a GPU's little
            env["INFERFLUX_RUNTIME__SPECULATIVE_DECODING__SECOND_ROW_COST"] = "0.2"
            env["INFERFLUX_RUNTIME__SPECULATIVE_DECODING__EXTRA_ROW_COST"] = "0.1"
        if config == "inferflux-draft":
            env["INFERFLUX_RUNTIME__SPECULATIVE_DECODING__MODE"] = "draft"
            env["INFERFLUX_SPEC_DRAFT_MODEL"] = draft or model.path
        return Server(config, base.argv, base.ready_path, env, base.ignore_eos)
    base = make_server("llama-server", tools, model, port, PARALLEL)
    extra: list[str] = []
    if config == "llama-server-draft":
        extra = ["--spec-type", "draft-simple", "-md", draft or model.path]
    elif config != "llama-server":
        extra = ["--spec-type", config.removeprefix("llama-server-")]
    return Server(config, [*base.argv, *extra], base.ready_path, base.env, base.ignore_eos)


async def _client(
    http: httpx.AsyncClient, url: str, prompts: list[str], max_tokens: int
) -> tuple[int, int, int]:
    """Send `prompts` one after another: (completion tokens, drafted, accepted)."""
    tokens = drafted = accepted = 0
    for prompt in prompts:
        body: dict[str, Any] = {  # Any: JSON
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        response = await http.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
        response.raise_for_status()
        data = response.json()
        tokens += data["usage"]["completion_tokens"]
        timings = data.get("timings") or {}  # llama-server's
        if "draft_n" in timings:
            drafted += timings["draft_n"]
            accepted += timings.get("draft_n_accepted", 0)
        else:  # InferFlux's, in OpenAI's Predicted Outputs fields
            details = data["usage"].get("completion_tokens_details") or {}
            accepted += details.get("accepted_prediction_tokens", 0)
            drafted += details.get("accepted_prediction_tokens", 0)
            drafted += details.get("rejected_prediction_tokens", 0)
    return tokens, drafted, accepted


async def _level(url: str, model: Model, workload: str, c: int, args: Any) -> dict[str, Any]:
    prompts = _prompts(workload)
    per_client = [
        [prompts[(i * args.per_client + j) % len(prompts)] for j in range(args.per_client)]
        for i in range(c)
    ]
    async with httpx.AsyncClient() as http:
        await _client(http, url, prompts[:1], 4)  # warm
        started = time.perf_counter()
        results = await asyncio.gather(
            *(_client(http, url, p, args.max_tokens) for p in per_client)
        )
        elapsed = time.perf_counter() - started
    tokens = sum(r[0] for r in results)
    drafted = sum(r[1] for r in results)
    accepted = sum(r[2] for r in results)
    return {
        "workload": workload,
        "concurrency": c,
        "tokens": tokens,
        "seconds": round(elapsed, 3),
        "tok_s": round(tokens / elapsed, 3),
        "drafted": drafted,
        "accepted": accepted,
    }


def run_model(key: str, tools: Toolchain, args: Any) -> list[dict[str, Any]]:
    model = load_model(key)
    rows: list[dict[str, Any]] = []
    for round_ in range(args.rounds):  # alternated: every config once a round
        for config in args.configs:
            if config.startswith("llama-server") and not tools.llama_server:
                continue
            server = _server(config, tools, model, args.port, args.draft_model, args.variants)
            with running(server, args.port, LOGS / f"speculative-{key}-{config}.log") as live:
                for workload in args.workloads:
                    for c in args.levels:
                        row = asyncio.run(_level(live.url, model, workload, c, args))
                        row.update(model=key, config=config, round=round_)
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], configs: list[str]) -> str:
    """One table per model: rows (workload, c), columns tok/s per config (the mean of the
    rounds, then × off's mean, then [min–max] of the rounds)."""
    out = []
    for key in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == key]
        present = [c for c in configs if any(r["config"] == c for r in mine)]
        out.append(f"### {key}\n")
        out.append("| workload | c | " + " | ".join(present) + " |")
        out.append("| --- | --- |" + " --- |" * len(present))
        for workload in dict.fromkeys(r["workload"] for r in mine):
            for c in sorted({r["concurrency"] for r in mine if r["workload"] == workload}):
                cells: dict[str, list[float]] = {}
                for r in mine:
                    if r["workload"] == workload and r["concurrency"] == c:
                        cells.setdefault(r["config"], []).append(r["tok_s"])
                off = cells.get("inferflux-off")
                texts = []
                for config in present:
                    runs = cells.get(config)
                    if runs is None:
                        texts.append("–")
                        continue
                    mean = statistics.fmean(runs)
                    ratio = f" ({mean / statistics.fmean(off):.2f}×)" if off else ""
                    spread = f" [{min(runs):.0f}–{max(runs):.0f}]" if len(runs) > 1 else ""
                    texts.append(f"{mean:.1f}{ratio}{spread}")
                out.append(f"| {workload} | {c} | " + " | ".join(texts) + " |")
        out.append("")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--levels", default="1,4,8")
    p.add_argument("--per-client", type=int, default=2, help="requests each client sends")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument(
        "--rounds", type=int, default=1, help="run every config this many times, alternated"
    )
    p.add_argument("--port", type=int, default=18431)
    p.add_argument("--out", default=str(RESULTS / "speculative"))
    add_config_args(p)
    return p


def add_config_args(p: argparse.ArgumentParser) -> None:
    """--draft-model and --variant (this script's and spec_paired.py's)."""
    p.add_argument("--draft-model", default=None, help="draft GGUF (default: the model)")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:ENV=VALUE[,ENV=VALUE]",
        help="also run inferflux-NAME: speculation on with these env settings (repeatable)",
    )


def resolve_configs(args: Any) -> Toolchain:
    """Fill args.variants, args.configs (with the variants) and args.workloads; refuse an
    unknown config; build llama-server only where a config needs it."""
    args.variants = variant_envs(args.variant)
    args.configs = [c for c in args.configs.split(",") if c]
    args.configs += [v for v in args.variants if v not in args.configs]
    unknown = set(args.configs) - set(CONFIGS) - set(args.variants)
    if unknown:
        raise SystemExit(f"unknown configs {sorted(unknown)}: choose from {', '.join(CONFIGS)}")
    args.workloads = [w for w in args.workloads.split(",") if w]
    needs_llama = any(c.startswith("llama-server") for c in args.configs)
    return Toolchain(toolchain.llama_server().binary if needs_llama else None, None)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    tools = resolve_configs(args)
    args.levels = [int(x) for x in args.levels.split(",")]
    rows = [row for key in args.models.split(",") for row in run_model(key, tools, args)]
    write_results(args.out, rows, markdown(rows, args.configs))
    return 0


def write_results(out: str, payload: Any, table: str) -> None:
    """`payload` to OUT.json, `table` to OUT.md and the terminal."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(table, encoding="utf-8")
    print(table)


if __name__ == "__main__":
    sys.exit(main())
