"""Serving several LoRA adapter sets of one base model: a context per set, or one context
switching sets between per-set decodes? (issue 9)

llama.cpp applies adapters per context: every sequence of one `llama_decode` sees the
same set. So sequences of different sets never share a decode, and the two designs are:

- `context-per-set`: one llama_context per adapter set over the same mmapped weights
  (what InferFlux does: an adapter model gets workers of its own). Each step decodes
  each context's group.
- `switch-per-group`: one llama_context; each step sets the group's adapters
  (`llama_set_adapters_lora`) before that group's decode.
- `one-batch` (reference, not a design): the same sequences in a single decode with no
  adapter at all; what a step would cost if adapters could be mixed in one batch.

Workload, in-process on the low-level API (no HTTP, no scheduler): `--sequences`
sequences split evenly across `--sets` adapter sets (set 0 = the base model), each a
seeded prompt of `--prompt` tokens prefilled in its group's batches, then `--tokens`
greedy steps. Reported: wall time and aggregate output tok/s of the decode phase and of
the whole run, the cost of one `llama_set_adapters_lora` call, and the RSS each design
adds over the loaded weights. The adapters are real LoRA GGUFs written with the `gguf`
package (tests/integration/model_registry_setup.write_lora).

Usage:
    .venv/bin/python bench/lora_batching.py                   # SmolLM2, 2 sets, 16 sequences
    .venv/bin/python bench/lora_batching.py --sets 4 --sequences 32 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import llama_cpp as ll
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.integration.model_registry_setup import write_lora  # noqa: E402

from inferflux.models.files import default_model_path  # noqa: E402

Ctx = Any  # llama_context*
_QUIET = ll.llama_log_callback(lambda *_: None)  # NOTE: llama.cpp keeps the pointer: keep it alive


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


class Group:
    """The sequences of one adapter set: seq ids, positions, last sampled tokens."""

    def __init__(self, seq_ids: list[int], prompts: list[list[int]]) -> None:
        self.seq_ids = seq_ids
        self.prompts = prompts
        self.pos = [0] * len(seq_ids)
        self.last = [0] * len(seq_ids)
        self.out: list[list[int]] = [[] for _ in seq_ids]


class Batch:
    """A llama_batch of up to `capacity` tokens, one seq id per token."""

    def __init__(self, capacity: int) -> None:
        self.raw = ll.llama_batch_init(capacity, 0, 1)
        self.capacity = capacity

    def fill(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """rows: (token, pos, seq_id, wants_logits)."""
        b = self.raw
        for i, (token, pos, seq_id, logits) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
            b.seq_id[i][0] = seq_id
        b.n_tokens = len(rows)

    def free(self) -> None:
        ll.llama_batch_free(self.raw)


def _argmax(ctx: Ctx, row: int, n_vocab: int) -> int:
    return int(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, row), (n_vocab,)).argmax())


def prefill(ctx: Ctx, batch: Batch, group: Group, n_vocab: int) -> None:
    """Decode the group's prompts in batches of at most `batch.capacity` tokens; sample
    each sequence's first token from its last prompt row."""
    pending = [(i, t, p) for i, prompt in enumerate(group.prompts) for p, t in enumerate(prompt)]
    for start in range(0, len(pending), batch.capacity):
        part = pending[start : start + batch.capacity]
        rows = []
        for i, token, pos in part:
            last = pos == len(group.prompts[i]) - 1
            rows.append((token, pos, group.seq_ids[i], last))
        batch.fill(rows)
        if ll.llama_decode(ctx, batch.raw) != 0:
            raise SystemExit("llama_decode failed in prefill")
        for row, (i, _, pos) in enumerate(part):
            if pos == len(group.prompts[i]) - 1:
                group.last[i] = _argmax(ctx, row, n_vocab)
                group.pos[i] = pos + 1


def decode_step(ctx: Ctx, batch: Batch, group: Group, n_vocab: int) -> None:
    """One greedy token for every sequence of `group` in one llama_decode."""
    batch.fill([(group.last[i], group.pos[i], s, True) for i, s in enumerate(group.seq_ids)])
    if ll.llama_decode(ctx, batch.raw) != 0:
        raise SystemExit("llama_decode failed in a decode step")
    for i in range(len(group.seq_ids)):
        group.out[i].append(group.last[i])
        group.last[i] = _argmax(ctx, i, n_vocab)
        group.pos[i] += 1


def make_context(model: Any, n_seq: int, ctx_per_seq: int, threads: int) -> Ctx:
    params = ll.llama_context_default_params()
    params.n_ctx = n_seq * ctx_per_seq
    params.n_batch = 512
    params.n_ubatch = 512
    params.n_seq_max = n_seq
    params.n_threads = threads
    params.n_threads_batch = threads
    params.no_perf = True
    ctx = ll.llama_init_from_model(model, params)
    if not ctx:
        raise SystemExit("could not create a context")
    return ctx


def set_adapters(ctx: Ctx, adapter: Any | None) -> None:  # Any: llama_adapter_lora*
    if adapter is None:
        status = ll.llama_set_adapters_lora(ctx, None, 0, None)
    else:
        arr = (ll.llama_adapter_lora_p_ctypes * 1)(adapter)
        status = ll.llama_set_adapters_lora(ctx, arr, 1, (ctypes.c_float * 1)(1.0))
    if status != 0:
        raise SystemExit("llama_set_adapters_lora failed")


def setup_design(
    name: str, model: Any, adapters: list[Any | None], prompts: list[list[list[int]]], args: Any
) -> tuple[list[Ctx], list[tuple[Ctx, Group, Any | None]]]:
    """The contexts of design `name`, and per group: its context, its sequences, and
    `("set", adapter)` when that adapter (None: the base) is set before each of its
    decodes, else None (the context keeps what it has)."""
    n_sets, per_set = len(prompts), len(prompts[0])
    if name == "context-per-set":
        contexts = [make_context(model, per_set, args.ctx, args.threads) for _ in adapters]
        for ctx, adapter in zip(contexts, adapters, strict=True):
            set_adapters(ctx, adapter)
        return contexts, [
            (ctx, Group(list(range(per_set)), p), None)
            for ctx, p in zip(contexts, prompts, strict=True)
        ]
    ctx = make_context(model, n_sets * per_set, args.ctx, args.threads)
    if name == "one-batch":  # every sequence in one group, no adapter
        flat = [p for group in prompts for p in group]
        return [ctx], [(ctx, Group(list(range(len(flat))), flat), None)]
    return [ctx], [
        (ctx, Group(list(range(k * per_set, (k + 1) * per_set)), p), ("set", adapters[k]))
        for k, p in enumerate(prompts)
    ]


def run_design(
    name: str,
    model: Any,
    adapters: list[Any | None],
    prompts: list[list[list[int]]],
    args: argparse.Namespace,
    n_vocab: int,
) -> dict[str, Any]:
    """Prefill then `args.tokens` steps of every group under design `name`."""
    rss_before = _rss_mb()
    batch = Batch(512)
    contexts, plan = setup_design(name, model, adapters, prompts, args)
    started = time.perf_counter()
    for ctx, group, switch in plan:
        if switch is not None:
            set_adapters(ctx, switch[1])
        prefill(ctx, batch, group, n_vocab)
    prefilled = time.perf_counter()
    for _ in range(args.tokens):
        for ctx, group, switch in plan:
            if switch is not None:
                set_adapters(ctx, switch[1])
            decode_step(ctx, batch, group, n_vocab)
    done = time.perf_counter()
    rss_contexts = _rss_mb()  # KV pages are resident once written
    outputs = [o for _, group, _ in plan for o in group.out]
    n_out = sum(len(o) for o in outputs)
    batch.free()
    for c in contexts:
        ll.llama_free(c)
    return {
        "design": name,
        "prefill_s": round(prefilled - started, 3),
        "decode_s": round(done - prefilled, 3),
        "decode_tok_s": round(n_out / (done - prefilled), 1),
        "total_tok_s": round(n_out / (done - started), 1),
        "context_rss_mb": round(rss_contexts - rss_before, 1),
        "outputs": outputs,
    }


def switch_cost_ms(model: Any, adapters: list[Any | None], args: argparse.Namespace) -> float:
    """Median wall time of one `llama_set_adapters_lora` that changes the set."""
    ctx = make_context(model, 1, args.ctx, args.threads)
    times = []
    for i in range(200):
        t = time.perf_counter()
        set_adapters(ctx, adapters[i % len(adapters)])
        times.append(time.perf_counter() - t)
    ll.llama_free(ctx)
    return float(np.median(times) * 1000)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="base GGUF (default: SmolLM2)")
    p.add_argument("--sets", type=int, default=2, help="adapter sets, the base model included")
    p.add_argument("--sequences", type=int, default=16)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per sequence")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per sequence")
    p.add_argument("--ctx", type=int, default=512, help="context per sequence")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.sequences % args.sets:
        raise SystemExit("--sequences must be a multiple of --sets")
    model_path = args.model or str(default_model_path())
    ll.llama_backend_init()
    ll.llama_log_set(_QUIET, ctypes.c_void_p(0))
    mparams = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(model_path.encode(), mparams)
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    with tempfile.TemporaryDirectory() as tmp:
        adapters: list[Any | None] = [None]
        for k in range(1, args.sets):
            path = write_lora(Path(tmp) / f"set{k}.gguf", model_path, seed=k)
            adapters.append(ll.llama_adapter_lora_init(model, str(path).encode()))
        rng = np.random.default_rng(0)
        per_set = args.sequences // args.sets
        prompts = [
            [rng.integers(100, min(n_vocab, 20000), args.prompt).tolist() for _ in range(per_set)]
            for _ in range(args.sets)
        ]
        switch_ms = switch_cost_ms(model, adapters, args)
        results: dict[str, list[dict[str, Any]]] = {}
        designs = ["context-per-set", "switch-per-group", "one-batch"]
        for _ in range(args.repeats):  # interleaved, so drift hits every design alike
            for name in designs:
                results.setdefault(name, []).append(
                    run_design(name, model, adapters, prompts, args, n_vocab)
                )
    same = results["context-per-set"][0]["outputs"] == results["switch-per-group"][0]["outputs"]
    rows = []
    for name in designs:
        runs = results[name]
        best = max(runs, key=lambda r: r["total_tok_s"])
        rows.append({k: v for k, v in best.items() if k != "outputs"})
    report = {
        "model": Path(model_path).name,
        "sets": args.sets,
        "sequences": args.sequences,
        "prompt_tokens": args.prompt,
        "tokens": args.tokens,
        "threads": args.threads,
        "switch_ms": round(switch_ms, 3),
        "same_outputs_context_vs_switch": same,
        "rows": rows,
    }
    print(format_markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def format_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"{report['model']}: {report['sequences']} sequences over {report['sets']} adapter "
        f"sets, {report['prompt_tokens']}-token prompts, {report['tokens']} greedy tokens, "
        f"{report['threads']} threads; one set switch {report['switch_ms']} ms; "
        f"same tokens in both designs: {report['same_outputs_context_vs_switch']}",
        "",
        "| design | prefill s | decode s | decode tok/s | total tok/s | context RSS MB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['design']} | {r['prefill_s']} | {r['decode_s']} | {r['decode_tok_s']} | "
        f"{r['total_tok_s']} | {r['context_rss_mb']} |"
        for r in report["rows"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
