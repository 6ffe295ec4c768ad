"""The most prompt-lookup speculation can give a workload on these cores: an oracle bound.

For every prompt of a `bench/speculative.py` workload, in process (no server):
1. the greedy output with speculation off (one-row steps, as the "off" server runs at
   c = 1), timed;
2. at every output position, how many of the coming tokens a drafter could have copied:
   - `ngram`: InferFlux's drafter (`NgramIndex`, its proposal at that position), up to its
     first wrong token;
   - `any`: the longest run of the coming tokens that a copy from anywhere in prompt +
     output so far gives (running on into what it copies, as a repeat does): what the
     best prompt-lookup drafter (llama-server's lookup modes included) could propose
     correctly;
3. an oracle that knows those runs and the measured cost of a 1..K+1-row step at this
   context (`bench/verify_rows.py`'s measurement, sawtooth and all) picks every step's
   draft length to finish the output in the least time (dynamic programming; it may pad
   a draft with rows it knows are wrong where the wider step is cheaper).

`--output-of on` computes the runs and the oracle over the output that speculation
produces instead: an EngineCore built as `inferflux serve` builds one (speculation on)
generates it. A verification step's logits differ from a one-row step's in the last
bits, so on a prompt the model may rewrite rather than copy the two greedy outputs can
part (BENCHMARKS, eighteenth session); the bound over off's output then says little of
what the server can reach. The report then also has the engine's own time for it
(`on_measured_s`, prefill included) and its drafted and accepted tokens. `--round R` puts
`bench/spec_paired.py`'s tag of round R before each prompt, so the outputs are those of
that round's requests.

The bound is off's time over the oracle's, both with the same measured prefill: no
drafter of that kind, verified on this model and these cores, reaches more. Server
overhead per step (scheduling, streaming) is left out of both, which favours the
oracle (it takes fewer steps). The prefill's share depends on the machine (prompt tokens
cost 1 ms each on one 2-core VM here and 5 ms on another, at 12.5 and 30 ms per
one-row step), so the decode steps' own bound is reported too. Off is priced at the
one-row step measured at the workload's mean context; `off_measured_s` is what the
generation took.

    .venv/bin/python bench/spec_bound.py --model gemma3 --workload edit
    .venv/bin/python bench/spec_bound.py --model smollm2 --workload edit,quote --json /tmp/b.json
    .venv/bin/python bench/spec_bound.py --model gemma3 --workload edit --output-of on --round 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import speculative as spec_bench
from compare.models import load_model
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend, LlamaTokenizer
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.core import EngineCore
from inferflux.engine.messages import AddRequest, SamplingParams
from inferflux.engine.speculative import NgramIndex
from verify_rows import GREEDY, measure


@dataclass(frozen=True, slots=True)
class Generation:
    prompt: list[int]
    output: list[int]
    prefill_s: float
    decode_s: float  # every one-row step of the output, sampling included


def prompt_tokens(tokenizer: LlamaTokenizer, text: str) -> list[int]:
    """The ids /v1/chat/completions gives one user message (BOS unless the template
    already wrote it)."""
    template = ChatTemplate.from_model(
        tokenizer.chat_template, tokenizer.architecture, tokenizer.bos_text, tokenizer.eos_text
    )
    rendered = template.render([{"role": "user", "content": text}])
    bos = tokenizer.bos_text
    add_special = not (bos and rendered.startswith(bos))
    return tokenizer.tokenize(rendered, add_special=add_special, parse_special=True)


def generate(backend: LlamaCppBackend, prompt: list[int], max_tokens: int) -> Generation:
    """Greedy output of `prompt`, one token a step (sequence 0, freed after)."""
    sampler = backend.make_sampler(GREEDY)
    backend.free_seq(0)
    started = time.perf_counter()
    last = 0
    for start in range(0, len(prompt), 512):
        chunk = prompt[start : start + 512]
        logits = 1 if start + len(chunk) == len(prompt) else 0
        last = backend.decode([(0, chunk, start, logits)])[0]
    token = backend.sample(sampler, last)
    prefill_s = time.perf_counter() - started
    output: list[int] = []
    started = time.perf_counter()
    while token not in backend.eog_token_ids:
        output.append(token)
        if len(output) == max_tokens:
            break
        last = backend.decode([(0, [token], len(prompt) + len(output) - 1, 1)])[0]
        token = backend.sample(sampler, last)
    decode_s = time.perf_counter() - started
    sampler.close()
    backend.free_seq(0)
    return Generation(prompt, output, prefill_s, decode_s)


@dataclass(frozen=True, slots=True)
class Drafted:
    output: list[int]
    seconds: float  # prefill included
    drafted: int
    accepted: int


def generate_on(core: EngineCore, prompt: list[int], max_tokens: int, name: str) -> Drafted:
    """Greedy output of `prompt` through `core` (speculation as the server runs it)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    started = time.perf_counter()
    core.add_request(AddRequest(request_id=name, prompt_token_ids=prompt, sampling=params))
    output: list[int] = []
    while True:
        for delta in core.step():
            output.extend(delta.token_ids)
            if delta.finish_reason is not None:  # its draft counts are the request's totals
                seconds = time.perf_counter() - started
                return Drafted(output, seconds, delta.num_draft_tokens, delta.num_draft_accepted)


def ngram_runs(prompt: list[int], output: list[int], k: int) -> list[int]:
    """At every output position t: how many of output[t:] InferFlux's drafter proposes
    correctly from prompt + output[:t] (its proposal of up to `k` tokens)."""
    index = NgramIndex()
    index.extend(prompt)
    runs = []
    for t in range(len(output)):
        draft = index.propose(k)
        run = 0
        while run < len(draft) and t + run < len(output) and draft[run] == output[t + run]:
            run += 1
        runs.append(run)
        index.extend(output[t : t + 1])
    return runs


def copy_runs(prompt: list[int], output: list[int], k: int) -> list[int]:
    """At every output position t: the longest run (at most `k`) of output[t:] that a copy
    starting inside prompt + output[:t] gives. A copy may run on into the tokens it
    produces (a repeat of period p copies from p tokens back), as NgramIndex's drafts
    do since the seventeenth session."""
    runs = []
    whole = prompt + output
    for t in range(len(output)):
        size = len(prompt) + t
        coming = output[t : t + k]
        best = 0
        first = coming[0] if coming else None
        for start in range(size):
            if whole[start] != first:
                continue
            run = 1
            while run < len(coming) and whole[start + run] == coming[run]:
                run += 1
            best = max(best, run)
        runs.append(best)
    return runs


def oracle_cost(runs: list[int], step_s: dict[int, float], k_max: int) -> tuple[float, int]:
    """Least time to produce len(runs) tokens when a step of 1 + k rows at position t yields
    1 + min(k, runs[t]) tokens and costs step_s[1 + k]; (seconds, steps)."""
    n = len(runs)
    best = [0.0] * (n + 1)
    steps = [0] * (n + 1)
    for t in range(n - 1, -1, -1):
        best[t] = float("inf")
        for k in range(0, k_max + 1):
            nxt = min(n, t + 1 + min(k, runs[t]))
            cost = step_s[1 + k] + best[nxt]
            if cost < best[t]:
                best[t], steps[t] = cost, 1 + steps[nxt]
    return best[0], steps[0]


def run(args: Any) -> dict[str, Any]:
    model = load_model(args.model)
    tokenizer = LlamaTokenizer(model.path)
    tag = (lambda i: f"Request {args.round}.{i + 1}. ") if args.round else (lambda i: "")
    prompts = {
        w: [prompt_tokens(tokenizer, tag(i) + p) for i, p in enumerate(spec_bench._prompts(w))]
        for w in args.workloads
    }
    tokenizer.close()
    longest = max(len(p) for ps in prompts.values() for p in ps)
    n_ctx = longest + args.max_tokens + args.k_max + 16
    config = ContextConfig(model.path, n_ctx, 1, 512, args.threads, args.threads, False)
    backend = LlamaCppBackend(config)
    core = None
    if args.output_of == "on":
        from engine_limit import load_engine  # the server's settings, speculation on

        core = load_engine(model.path, None)[2]
    report: dict[str, Any] = {
        "model": os.path.basename(model.path),
        "threads": args.threads,
        "output_of": args.output_of,
        "round": args.round,
        "workloads": [],
    }
    for workload, workload_prompts in prompts.items():
        # the step costs at this workload's mean context (attention grows with it)
        context = sum(len(p) for p in workload_prompts) // len(workload_prompts)
        context += args.max_tokens // 2
        step_s = {}
        for rows in range(1, args.k_max + 2):
            decode_s, sample_s = measure(backend, context, rows, args.repeats)
            step_s[rows] = decode_s + sample_s
        totals = dict.fromkeys(("prefill", "off", "ngram", "any", "off_measured"), 0.0)
        tokens = accepted_ngram = accepted_any = 0
        on = {"seconds": 0.0, "drafted": 0, "accepted": 0, "outputs_differ": 0}
        generations = []
        for i, prompt in enumerate(workload_prompts):
            gen = generate(backend, prompt, args.max_tokens)
            if core is not None:
                drafted = generate_on(core, prompt, args.max_tokens, f"{workload}-{i}")
                on["seconds"] += drafted.seconds
                on["drafted"] += drafted.drafted
                on["accepted"] += drafted.accepted
                on["outputs_differ"] += drafted.output != gen.output
                gen = Generation(prompt, drafted.output, gen.prefill_s, gen.decode_s)
            generations.append({"prompt": gen.prompt, "output": gen.output})
            n = len(gen.output)
            tokens += n
            totals["prefill"] += gen.prefill_s
            totals["off_measured"] += gen.decode_s
            # the first token comes from the prefill step (which carries no draft)
            totals["off"] += (n - 1) * step_s[1]
            for name, runs_of in (("ngram", ngram_runs), ("any", copy_runs)):
                runs = runs_of(gen.prompt, gen.output, args.k_max)[1:]
                cost, steps = oracle_cost(runs, step_s, args.k_max)
                totals[name] += cost
                if name == "ngram":
                    accepted_ngram += n - 1 - steps
                else:
                    accepted_any += n - 1 - steps
        prefill = totals["prefill"]
        row = {
            "workload": workload,
            "cost_context": context,
            "step_ms": {str(r): round(s * 1000, 3) for r, s in step_s.items()},
            "prompts": len(workload_prompts),
            "output_tokens": tokens,
            "prefill_s": round(prefill, 3),
            "off_s": round(prefill + totals["off"], 3),
            "off_measured_s": round(prefill + totals["off_measured"], 3),
            "ngram_oracle_s": round(prefill + totals["ngram"], 3),
            "any_copy_oracle_s": round(prefill + totals["any"], 3),
            "ngram_tokens_without_a_step": accepted_ngram,
            "any_copy_tokens_without_a_step": accepted_any,
            "bound_ngram": round((prefill + totals["off"]) / (prefill + totals["ngram"]), 3),
            "bound_any_copy": round((prefill + totals["off"]) / (prefill + totals["any"]), 3),
            # the decode steps alone: what the bound is where prompt tokens cost little
            "decode_bound_ngram": round(totals["off"] / totals["ngram"], 3),
            "decode_bound_any_copy": round(totals["off"] / totals["any"], 3),
        }
        if core is not None:  # off_measured_s is then of off's own output, not this one
            row["on_measured_s"] = round(on["seconds"], 3)
            row["on_drafted"], row["on_accepted"] = on["drafted"], on["accepted"]
            row["prompts_whose_outputs_differ"] = on["outputs_differ"]
        report["workloads"].append(row)
        # what bench/spec_policy.py replays: the outputs and the measured step costs
        report.setdefault("generations", {})[workload] = {
            "step_s": {str(r): s for r, s in step_s.items()},
            "prefill_s": prefill,
            "outputs": generations,
        }
        print(json.dumps(row), flush=True)
    backend.close()
    if core is not None:
        core.close()
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3", help="smollm2 or gemma3 (bench/compare)")
    p.add_argument("--workload", default="edit,quote", help="of bench/speculative.py")
    p.add_argument("--max-tokens", type=int, default=192, help="as bench/speculative.py")
    p.add_argument("--k-max", type=int, default=32, help="the longest draft (the server's cap)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--output-of",
        choices=("off", "on"),
        default="off",
        help="whose greedy output the oracle runs over: one-row steps, or the engine's "
        "with speculation on",
    )
    p.add_argument("--round", type=int, default=0, help="spec_paired.py's tag of this round")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.workloads = args.workload.split(",")
    report = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
