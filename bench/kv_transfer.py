"""KV hand-off cost of disaggregated prefill/decode (engine/kv_channel.py), per prompt length.

Two llama.cpp contexts of one model in this process stand for a prefill and a decode
worker: the prefill side computes a prompt of N tokens (random ids) once, then, `--reps`
times, writes its KV ticket to shared memory (`/dev/shm`: llama.cpp's
`llama_state_seq_get_data` straight into the file's map) and the decode side hydrates it
(the file mapped, the fingerprint checked, `llama_state_seq_set_data` from the map).
Each ticket is written twice: into a new file (fresh tmpfs pages) and into a recycled one
(the server's ring: engine/ticket_slots.py); the decode side reads the recycled one.
Reported per model and N: the ticket's bytes, and p50/p99 of each write, of the hydrate,
and of recycled write + hydrate ("copy floor": what a hand-off costs beyond moving one
small message, with no queueing; bench/disaggregated.py measures it end to end on a
server, where the decode worker reads its inputs only between engine steps).

    .venv/bin/python bench/kv_transfer.py --json bench/results/kv_transfer.json
    .venv/bin/python bench/kv_transfer.py --models smollm2 --lengths 128,1024 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare.models import model_path  # noqa: E402
from inferflux.engine.backends.llama_cpp import ContextConfig, LlamaCppBackend  # noqa: E402
from inferflux.engine.kv_channel import KvChannelEnd, ticket_model_id  # noqa: E402
from inferflux.engine.messages import KvTicket  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _length(
    ends: tuple[KvChannelEnd, KvChannelEnd], n_tokens: int, reps: int, folder: str
) -> dict[str, Any]:
    prefill, decode = ends
    rng = np.random.default_rng(n_tokens)
    tokens = [int(t) for t in rng.integers(100, 5000, n_tokens)]
    backend = prefill.backend
    assert isinstance(backend, LlamaCppBackend)
    backend.free_seq(0)
    for start in range(0, n_tokens, 512):
        backend.decode([(0, tokens[start : start + 512], start, 0)])
    fresh, writes, hydrates, totals = [], [], [], []
    nbytes = 0
    ring = os.path.join(folder, f"ring{n_tokens}")
    prefill.write(ring, 0, tokens, "")  # the ring's file, written once before
    for rep in range(reps):
        path = os.path.join(folder, f"t{n_tokens}-{rep}")
        fresh.append(prefill.write(path, 0, tokens, "").write_s)
        os.unlink(path)
        ticket: KvTicket = prefill.write(ring, 0, tokens, "")
        started = time.perf_counter()
        assert decode.hydrate(f"r{rep}", ticket, 0, tokens, "")
        hydrate_s = time.perf_counter() - started
        writes.append(ticket.write_s)
        hydrates.append(hydrate_s)
        totals.append(ticket.write_s + hydrate_s)
        nbytes = ticket.nbytes
    row: dict[str, Any] = {"n_tokens": n_tokens, "ticket_mb": nbytes / 1e6}
    named = (("fresh_write", fresh), ("write", writes), ("hydrate", hydrates), ("total", totals))
    for name, values in named:
        row[f"{name}_p50_ms"] = 1000 * statistics.median(values)
        row[f"{name}_p99_ms"] = 1000 * _pct(values, 0.99)
    row["gb_per_s"] = nbytes / 1e9 / statistics.median(totals) / 2  # two copies
    return row


def run_model(key: str, lengths: list[int], reps: int) -> list[dict[str, Any]]:
    path = model_path(key)
    n_ctx = max(lengths) + 64
    sides = [LlamaCppBackend(ContextConfig(path, n_ctx, 1, 512, 2, 2, False)) for _ in range(2)]
    model_id = ticket_model_id(path, "", ())
    ends = (KvChannelEnd(sides[0], model_id), KvChannelEnd(sides[1], model_id))
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="kv-transfer-", dir="/dev/shm") as folder:
            for n in lengths:
                row = {"model": key} | _length(ends, n, reps, folder)
                print(
                    f"{key:8} {n:5} tokens  {row['ticket_mb']:7.2f} MB  "
                    f"new {row['fresh_write_p50_ms']:6.2f}/{row['fresh_write_p99_ms']:6.2f} ms  "
                    f"write {row['write_p50_ms']:6.2f}/{row['write_p99_ms']:6.2f} ms  "
                    f"hydrate {row['hydrate_p50_ms']:6.2f}/{row['hydrate_p99_ms']:6.2f} ms  "
                    f"total {row['total_p50_ms']:6.2f}/{row['total_p99_ms']:6.2f} ms",
                    flush=True,
                )
                rows.append(row)
    finally:
        for side in sides:
            side.close()
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | tokens | ticket MB | write, new file p50/p99 ms "
        "| write, recycled p50/p99 ms | hydrate p50/p99 ms "
        "| recycled write + hydrate p50/p99 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['n_tokens']} | {r['ticket_mb']:.2f} "
            f"| {r['fresh_write_p50_ms']:.2f} / {r['fresh_write_p99_ms']:.2f} "
            f"| {r['write_p50_ms']:.2f} / {r['write_p99_ms']:.2f} "
            f"| {r['hydrate_p50_ms']:.2f} / {r['hydrate_p99_ms']:.2f} "
            f"| {r['total_p50_ms']:.2f} / {r['total_p99_ms']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--lengths", default="128,256,512,1024,2048,4096")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    rows = [row for key in args.models.split(",") for row in run_model(key, lengths, args.reps)]
    print("\n" + markdown(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"args": vars(args) | {"json": str(args.json)}, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
