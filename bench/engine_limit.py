"""The engine ceiling: bench/serve_load.py's workload driven straight into EngineCore.

No HTTP, no IPC, no JSON: the same seeded chat prompts, rendered with the model's chat
template and tokenized as the server does, submitted by N closed-loop "clients" (each
sends its next prompt when the previous one finishes) into an EngineCore built from the
same settings as `inferflux serve`. Every request is greedy with `ignore_eos`, so it
generates exactly max_tokens. TTFT and ITL are taken when a step returns the request's
delta, which is as early as any transport could see it.

The report has the same columns as serve_load.py, so the two tables compare directly
(server / engine = what HTTP, IPC and SSE cost).

Usage:
    .venv/bin/python bench/engine_limit.py                       # levels 1,4,8,16
    .venv/bin/python bench/engine_limit.py --concurrency 8 --model path/to/model.gguf
    .venv/bin/python bench/engine_limit.py --json bench/results/engine.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferflux.config import load_settings
from inferflux.engine.backends.llama_cpp import LlamaTokenizer
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.core import EngineCore
from inferflux.engine.engine_build import build_engine_core, worker_config
from inferflux.engine.messages import AddRequest, SamplingParams
from inferflux.engine.protocol import ModelInfo
from inferflux.models.files import load_served_model
from serve_load import LoadConfig, RequestResult, format_table, level_report, parse_levels
from workload import make_prompts


@dataclass(slots=True)
class _Client:
    prompts: list[list[int]]
    results: list[RequestResult] = field(default_factory=list)
    sent_at: float = 0.0
    last_at: float = 0.0


def tokenize_prompts(
    tokenizer: LlamaTokenizer, architecture: str, prompts: list[str]
) -> list[list[int]]:
    template = ChatTemplate.from_model(
        tokenizer.chat_template, architecture, tokenizer.bos_text, tokenizer.eos_text
    )
    out = []
    for prompt in prompts:
        text = template.render([{"role": "user", "content": prompt}])
        add_special = not (tokenizer.bos_text and text.startswith(tokenizer.bos_text))
        out.append(tokenizer.tokenize(text, add_special=add_special, parse_special=True))
    return out


def load_engine(
    model: str | None, config_file: str | None, overrides: dict[str, Any] | None = None
) -> tuple[ModelInfo, LlamaTokenizer, EngineCore]:
    """The served model, its tokenizer, and an EngineCore built exactly as one
    `inferflux serve` worker with the same settings (plus dotted-key `overrides`)."""
    settings = load_settings(config_file, overrides={"model.path": model, **(overrides or {})})
    info, tokenizer = load_served_model(settings)
    return info, tokenizer, build_engine_core(worker_config(settings, info))


def run_level(
    core: EngineCore, prompts: list[list[int]], concurrency: int, max_tokens: int
) -> tuple[list[RequestResult], float]:
    clients = [_Client(prompts[i::concurrency]) for i in range(concurrency)]
    active: dict[str, tuple[_Client, RequestResult]] = {}
    counter = 0

    def submit(client: _Client) -> None:
        nonlocal counter
        if len(client.results) >= len(client.prompts):
            return
        prompt = client.prompts[len(client.results)]
        result = RequestResult()
        client.results.append(result)
        request_id = f"bench-{counter}"
        counter += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        client.sent_at = client.last_at = time.perf_counter()
        active[request_id] = (client, result)
        core.add_request(
            AddRequest(request_id=request_id, prompt_token_ids=prompt, sampling=params)
        )

    started = time.perf_counter()
    for client in clients:
        submit(client)
    while active:
        deltas = core.step()
        now = time.perf_counter()
        for delta in deltas:
            client, result = active[delta.request_id]
            if delta.text:
                if result.ttft_s is None:
                    result.ttft_s = now - client.sent_at
                else:
                    result.itl_s.append(now - client.last_at)
                client.last_at = now
            if delta.finish_reason is not None:
                result.output_tokens = delta.num_output_tokens
                result.usage_reported = True
                result.finish_reason = str(delta.finish_reason)
                result.e2e_s = now - client.sent_at
                del active[delta.request_id]
                submit(client)
    wall_s = time.perf_counter() - started
    return [r for c in clients for r in c.results], wall_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="GGUF path (default: the server default)")
    p.add_argument("--config", default=None, help="an inferflux YAML config (same as serve)")
    p.add_argument("--concurrency", type=parse_levels, default=[1, 4, 8, 16])
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-words", type=int, default=16)
    p.add_argument("--max-words", type=int, default=128)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    info, tokenizer, core = load_engine(args.model, args.config)
    config = LoadConfig(
        url="engine://in-process",
        model=info.model_id,
        endpoint="chat",
        max_tokens=args.max_tokens,
        requests_per_client=args.requests,
        seed=args.seed,
        min_words=args.min_words,
        max_words=args.max_words,
    )
    print(f"engine ceiling: {info.model_id}", flush=True)
    warm = tokenize_prompts(tokenizer, info.architecture, make_prompts(1, args.seed + 1, 8, 16))
    run_level(core, warm, 1, 8)
    levels: list[dict[str, Any]] = []
    for concurrency in args.concurrency:
        total = concurrency * args.requests
        texts = make_prompts(total, args.seed, args.min_words, args.max_words)
        prompts = tokenize_prompts(tokenizer, info.architecture, texts)
        results, wall_s = run_level(core, prompts, concurrency, args.max_tokens)
        levels.append(level_report(concurrency, results, wall_s, config))
        print(format_table(levels[-1:]), flush=True)
    print("\n" + format_table(levels))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"config": asdict(config), "levels": levels}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    core.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
