"""The measured workloads, each returning one row of the comparison table.

stream    N closed-loop clients send streaming chat or completion requests (bench/
          serve_load.py): seeded prompts of `MIN_WORDS`..`MAX_WORDS` words (≈50–390
          tokens), greedy, exactly max_tokens output tokens each.
agent     bench/agent_trace.py's multi-turn corpus, conversations concurrently, every
          answer max_tokens long and appended to its history (prefix reuse matters).
engine    the stream workload's chat prompts straight into an in-process EngineCore
          (bench/engine_limit.py): the ceiling the server is held to.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import agent_trace
import engine_limit
import serve_load
from compare.servers import CTX_PER_SEQ, Running
from workload import make_prompts

MIN_WORDS = 45
MAX_WORDS = 320


@dataclass(frozen=True, slots=True)
class Plan:
    """What every level runs: request counts and lengths."""

    requests_per_client: int = 2
    min_requests: int = 8  # per level: low levels send more requests per client
    max_tokens: int = 128
    agent_max_tokens: int = 48
    agent_turns: int | None = None  # first turns of each conversation only (smoke runs)
    seed: int = 0
    threads: int = 2  # llama.cpp threads of every server (and of the engine)

    def per_client(self, concurrency: int) -> int:
        return max(self.requests_per_client, math.ceil(self.min_requests / concurrency))


def _load_config(
    run: Running, model_id: str, endpoint: str, plan: Plan, concurrency: int, extra: dict[str, Any]
) -> serve_load.LoadConfig:
    return serve_load.LoadConfig(
        url=run.url,
        model=model_id,
        endpoint=endpoint,
        max_tokens=plan.max_tokens,
        requests_per_client=plan.per_client(concurrency),
        seed=plan.seed,
        min_words=MIN_WORDS,
        max_words=MAX_WORDS,
        ignore_eos=run.server.ignore_eos,
        extra_body=extra,
    )


def _row(level: dict[str, Any], run: Running | None, workload: str) -> dict[str, Any]:
    """A level report without per-request data, plus the server's peak memory."""
    row = {k: v for k, v in level.items() if k != "requests"}
    row["workload"] = workload
    # per request, without the inter-token gaps (those are summarised in itl_s)
    row["requests"] = [{k: v for k, v in r.items() if k != "itl_s"} for r in level["requests"]]
    prompts = [r["prompt_tokens"] for r in level["requests"] if r.get("prompt_tokens")]
    row["prompt_tokens_mean"] = sum(prompts) / len(prompts) if prompts else None
    if run is not None:
        peak = run.rss.reset()
        row["rss_tree_bytes"] = peak.tree
        row["rss_largest_process_bytes"] = peak.largest_process
        row["rss_per_process_bytes"] = peak.per_process
    return row


async def _warm(client: Any, config: serve_load.LoadConfig) -> None:  # Any: httpx client
    short = dataclasses.replace(config, max_tokens=8)
    for prompt in make_prompts(2, config.seed + 1, 8, 16):
        result = await serve_load.stream_one(client, short, prompt)
        if not result.ok:
            raise SystemExit(f"warm-up request to {config.url} failed: {result.error}")


async def stream(
    run: Running, endpoints: list[str], plan: Plan, concurrency: int, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per endpoint ("chat", "completions") at `concurrency`."""
    rows = []
    async with serve_load.make_http_client(
        _load_config(run, "", "chat", plan, concurrency, extra), concurrency
    ) as client:
        model_id = await serve_load.resolve_model(client)
        await _warm(client, _load_config(run, model_id, "chat", plan, 1, extra))
        run.rss.reset()
        for endpoint in endpoints:
            config = _load_config(run, model_id, endpoint, plan, concurrency, extra)
            level = await serve_load.run_level(client, config, concurrency)
            rows.append(_row(level, run, endpoint))
    return rows


def agent_corpus(plan: Plan, fold_system: bool) -> list[dict[str, Any]]:
    """bench/agent_trace.py's conversations, cut to `plan.agent_turns`; with `fold_system`
    the system prompt opens the first user turn instead (what a Gemma template does)."""
    corpus = []
    for line in agent_trace.CORPUS.read_text(encoding="utf-8").splitlines():
        conv = json.loads(line)
        turns = [dict(t) for t in conv["turns"][: plan.agent_turns]]
        if fold_system and turns:
            turns[0]["content"] = f"{conv['system']}\n\n{turns[0]['content']}"
            conv = conv | {"system": None}
        corpus.append(conv | {"turns": turns})
    return corpus


async def agent(
    run: Running, plan: Plan, extra: dict[str, Any], fold_system: bool
) -> dict[str, Any]:
    """The agent-trace replay as one row (concurrency = conversations)."""
    corpus = agent_corpus(plan, fold_system)
    async with serve_load.make_http_client(
        _load_config(run, "", "chat", plan, len(corpus), extra), len(corpus)
    ) as client:
        model_id = await serve_load.resolve_model(client)
        config = agent_trace.turn_config(run.url, model_id, plan.agent_max_tokens)
        config = dataclasses.replace(config, ignore_eos=run.server.ignore_eos, extra_body=extra)
        await _warm(client, config)
        run.rss.reset()
        per_conv, wall_s = await agent_trace.replay_turns(client, config, corpus)
    results = [r for conv in per_conv for r in conv]
    level = serve_load.level_report(len(corpus), results, wall_s, config)
    row = _row(level, run, "agent")
    row["ttft_turn3plus_s"] = agent_trace.ttft_summaries(per_conv)["ttft_turn3plus"]
    row["cached_tokens"] = sum(r.cached_tokens or 0 for r in results)
    row["prompt_tokens"] = sum(r.prompt_tokens or 0 for r in results)
    return row


def engine(model_path: str, plan: Plan, concurrency: int) -> dict[str, Any]:
    """The chat workload at `concurrency` in an in-process EngineCore: the ceiling row."""
    overrides = {
        "scheduler.max_num_seqs": concurrency,
        "model.ctx_size": CTX_PER_SEQ,
        "runtime.n_threads": plan.threads,
    }
    info, tokenizer, core = engine_limit.load_engine(model_path, None, overrides)
    try:
        warm = make_prompts(2, plan.seed + 1, 8, 16)
        engine_limit.run_level(
            core, engine_limit.tokenize_prompts(tokenizer, info.architecture, warm), 1, 8
        )
        total = concurrency * plan.per_client(concurrency)
        texts = make_prompts(total, plan.seed, MIN_WORDS, MAX_WORDS)
        prompts = engine_limit.tokenize_prompts(tokenizer, info.architecture, texts)
        results, wall_s = engine_limit.run_level(core, prompts, concurrency, plan.max_tokens)
    finally:
        core.close()
        tokenizer.close()
    config = serve_load.LoadConfig(
        "engine://in-process", info.model_id, "chat", plan.max_tokens,
        plan.per_client(concurrency), plan.seed, MIN_WORDS, MAX_WORDS,
    )  # fmt: skip
    return _row(serve_load.level_report(concurrency, results, wall_s, config), None, "chat")
