"""Unified against disaggregated prefill/decode on one machine, under the same load.

Each setting runs a fresh `inferflux serve` and the same workload: `--concurrency`
streaming clients, each sending `--requests` chat requests one after another, with long
prompts (`--min-words`..`--max-words`, distinct, so the prefix cache does not help) and
long generations (`--max-tokens`, `ignore_eos`): new prompts arrive while other streams
decode, the case disaggregation is for. Settings (`--settings`):

- `unified`: one worker, every core (the default server);
- `unified_itl`: the same with `scheduler.itl_target_ms` (stall-free batching, the
  unified answer to the same problem: `--itl-target-ms`);
- `disaggregated`: one prefill and one decode worker (`--prefill`, `--decode`), the
  cores shared among them (`scheduler.disaggregated.*_threads` unset);
- `disaggregated_p2`: the same, but each prefill worker runs 2 threads and each decode
  worker 1 (`prefill_threads` / `decode_threads`: oversubscribed on 2 cores).

Settings run in alternated order over `--rounds` rounds, so a drift of the machine hits
them alike; the report gives per setting the median over rounds of output tok/s, TTFT
p50/p99 and ITL p50/p99, and for `disaggregated` the end-to-end KV transfer latency
(prefill worker's enqueue → decode worker's hydrate, queueing included) from the
server's `inferflux_kv_transfer_seconds` histogram: p50/p99 as the upper bounds of the
buckets they fall in, and the mean.

    .venv/bin/python bench/disaggregated.py --json bench/results/disaggregated_smollm2.json
    .venv/bin/python bench/disaggregated.py --model gemma --rounds 1
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import httpx

from itl_tradeoff import latency_row, load_arguments, report, run_rounds, run_setting
from serve_load import format_table

_PORT = 18461


def _env(setting: str, args: argparse.Namespace) -> dict[str, str]:
    if setting == "unified":
        return {}
    if setting == "unified_itl":
        return {"INFERFLUX_SCHEDULER__ITL_TARGET_MS": str(args.itl_target_ms)}
    if setting.startswith("disaggregated"):
        env = {
            "INFERFLUX_SCHEDULER__MODE": "disaggregated",
            "INFERFLUX_SCHEDULER__PREFILL_POOL_SIZE": str(args.prefill),
            "INFERFLUX_SCHEDULER__DECODE_POOL_SIZE": str(args.decode),
        }
        if setting == "disaggregated_p2":
            env["INFERFLUX_SCHEDULER__DISAGGREGATED__PREFILL_THREADS"] = "2"
            env["INFERFLUX_SCHEDULER__DISAGGREGATED__DECODE_THREADS"] = "1"
        return env
    raise ValueError(f"unknown setting {setting!r}")


def transfer_quantiles(metrics_text: str) -> dict[str, float] | None:
    """p50/p99 (bucket upper bounds), mean and count of inferflux_kv_transfer_seconds."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("inferflux_kv_transfer_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
        elif line.startswith("inferflux_kv_transfer_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("inferflux_kv_transfer_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    if not count:
        return None

    def bound(q: float) -> float:
        return next(le for le, n in sorted(buckets) if n >= q * count)

    return {
        "count": count,
        "mean_s": total / count,
        "p50_le_s": bound(0.5),
        "p99_le_s": bound(0.99),
    }


async def _transfer_and_channel(client: httpx.AsyncClient, level: dict[str, Any]) -> None:
    level["kv_transfer"] = transfer_quantiles((await client.get("/metrics")).text)
    level["channel"] = (await client.get("/server/stats")).json().get("channel")


def _run(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    level = run_setting(_PORT, args, _env(setting, args), _transfer_and_channel)
    level["setting"] = setting
    print(f"{setting}\n" + format_table([level]), flush=True)
    if level["kv_transfer"]:
        print(f"  kv transfer: {level['kv_transfer']}  channel: {level['channel']}", flush=True)
    return level


def summarize(runs: list[dict[str, Any]], settings: list[str]) -> list[dict[str, Any]]:
    rows = []
    for setting in settings:
        levels = [r for r in runs if r["setting"] == setting]
        transfers = [lv["kv_transfer"] for lv in levels if lv["kv_transfer"]]
        rows.append(
            {"setting": setting}
            | latency_row(levels)
            | {
                "transfer_mean_ms": (
                    1000 * statistics.median(t["mean_s"] for t in transfers) if transfers else None
                ),
                "transfer_p99_le_ms": (
                    1000 * max(t["p99_le_s"] for t in transfers) if transfers else None
                ),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| setting | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
        "| KV transfer mean / p99 ≤ ms | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        transfer = (
            f"{r['transfer_mean_ms']:.1f} / {r['transfer_p99_le_ms']:.0f}"
            if r["transfer_mean_ms"] is not None
            else "-"
        )
        lines.append(
            f"| {r['setting']} | {r['output_tok_s']:.1f} | {r['ttft_p50_ms']:.0f} "
            f"| {r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.0f} | {r['itl_p99_ms']:.0f} "
            f"| {transfer} | {r['errors']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", default="unified,unified_itl,disaggregated")
    p.add_argument("--itl-target-ms", type=float, default=150.0)
    p.add_argument("--prefill", type=int, default=1)
    p.add_argument("--decode", type=int, default=1)
    load_arguments(p, concurrency=4, max_tokens=128, min_words=300, max_words=1200, seed=26)
    args = p.parse_args(argv)
    settings = args.settings.split(",")
    runs = run_rounds(settings, args, lambda setting: _run(setting, args))
    rows = summarize(runs, settings)
    return report(args, rows, runs, markdown(rows))


if __name__ == "__main__":
    raise SystemExit(main())
