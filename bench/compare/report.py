"""The comparison as one markdown table per model, the ratios, and the targets of issue 10.

Rows are dicts from compare.workloads plus "server"; ratios are InferFlux over each other
server at the same workload and concurrency: aggregate output tok/s, and TTFT p50 (lower
is better for TTFT, higher for tok/s).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

Row = dict[str, Any]  # Any: JSON
MB = 1024 * 1024
OTHERS = ("llama-server", "llama-cpp-python", "engine")
_HEADER = (
    "| workload | conc | server | out tok/s | req tok/s | TTFT p50 ms | TTFT p99 ms "
    "| ITL p50 ms | ITL p99 ms | errors | peak RSS MB | IF / llama-server "
    "| IF / llama-cpp-python | IF / engine |"
)


def _ms(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key)
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.0f}"


def find(rows: Iterable[Row], server: str, workload: str, concurrency: int | None) -> Row | None:
    """The row of `server` at `workload` and `concurrency` (None: any)."""
    for row in rows:
        if (row["server"], row["workload"]) == (server, workload) and concurrency in (
            None,
            row["concurrency"],
        ):
            return row
    return None


def tok_ratio(ours: Row, other: Row | None) -> float | None:
    if other is None or not other["output_tok_s"]:
        return None
    return float(ours["output_tok_s"]) / float(other["output_tok_s"])


def ttft_ratio(ours: Row, other: Row | None) -> float | None:
    mine, theirs = ours["ttft_s"].get("p50"), (other or {}).get("ttft_s", {}).get("p50")
    return mine / theirs if mine and theirs else None


def _ratio_cell(rows: list[Row], row: Row, other: str) -> str:
    if not row["server"].startswith("inferflux"):
        return ""
    match = find(rows, other, row["workload"], row["concurrency"])
    tok, ttft = tok_ratio(row, match), ttft_ratio(row, match)
    cells = ([f"{tok:.2f}×"] if tok else []) + ([f"TTFT {ttft:.2f}×"] if ttft else [])
    return " · ".join(cells) or "-"


def _cells(rows: list[Row], row: Row) -> list[str]:
    rss = row.get("rss_tree_bytes")
    errors = f"{row['num_errors']}/{row['num_requests']}"
    if row.get("num_short"):
        errors += f" ({row['num_short']} short)"
    return [
        row["workload"],
        str(row["concurrency"]),
        row["server"],
        f"{row['output_tok_s']:.1f}",
        f"{row['request_tok_s']['mean'] or 0:.1f}",
        _ms(row["ttft_s"], "p50"),
        _ms(row["ttft_s"], "p99"),
        _ms(row["itl_s"], "p50"),
        _ms(row["itl_s"], "p99"),
        errors,
        f"{rss / MB:.0f}" if rss else "-",
        *(_ratio_cell(rows, row, other) for other in OTHERS),
    ]


def table(rows: list[Row]) -> str:
    lines = [_HEADER, "|" + " --- |" * _HEADER.count(" |")]
    lines += ["| " + " | ".join(_cells(rows, row)) + " |" for row in rows]
    return "\n".join(lines)


Check = tuple[str, Callable[[list[Row], dict[str, Any]], tuple[bool | None, str]]]


def _every_level(rows: list[Row], _: dict[str, Any]) -> tuple[bool | None, str]:
    ratios = []
    for row in rows:
        if row["server"] == "inferflux" and row["workload"] in ("chat", "completions"):
            ratio = tok_ratio(row, find(rows, "llama-server", row["workload"], row["concurrency"]))
            if ratio is not None:
                ratios.append((ratio, f"{row['workload']} c={row['concurrency']}"))
    if not ratios:
        return None, "not measured"
    worst = min(ratios)
    return worst[0] >= 1.0, f"lowest {worst[0]:.2f}× ({worst[1]})"


def _pair(workload: str, concurrency: int | None, other: str, metric: str, limit: float) -> Any:
    def check(rows: list[Row], _: dict[str, Any]) -> tuple[bool | None, str]:
        ours = find(rows, "inferflux", workload, concurrency)
        if ours is None or find(rows, other, workload, concurrency) is None:
            return None, "not measured"
        ratio = (tok_ratio if metric == "tok" else ttft_ratio)(
            ours, find(rows, other, workload, concurrency)
        )
        if ratio is None:
            return None, "not measured"
        met = ratio >= limit if metric == "tok" else ratio <= limit
        return met, f"{ratio:.2f}×"

    return check


def _vs_engine(rows: list[Row], _: dict[str, Any]) -> tuple[bool | None, str]:
    ratios = [
        (tok_ratio(row, find(rows, "engine", "chat", row["concurrency"])), row["concurrency"])
        for row in rows
        if row["server"] == "inferflux" and row["workload"] == "chat"
    ]
    measured = [(r, c) for r, c in ratios if r is not None]
    if not measured:
        return None, "not measured"
    worst = min(measured)
    return worst[0] >= 0.9, f"lowest {worst[0]:.2f}× (c={worst[1]})"


def _memory(rows: list[Row], model: dict[str, Any]) -> tuple[bool | None, str]:
    worst: tuple[float, str] | None = None
    for row in rows:
        if row["server"] != "inferflux" or not row.get("rss_largest_process_bytes"):
            continue
        budget = model["file_bytes"] + kv_bytes(model, row["concurrency"]) + 300 * MB
        margin = budget - row["rss_largest_process_bytes"]
        label = f"{row['rss_largest_process_bytes'] / MB:.0f} MB of {budget / MB:.0f} MB budget"
        if worst is None or margin < worst[0]:
            worst = (margin, f"{label} ({row['workload']} c={row['concurrency']})")
    if worst is None:
        return None, "not measured"
    return worst[0] >= 0, "tightest: " + worst[1]


def kv_bytes(model: dict[str, Any], max_num_seqs: int) -> int:
    """InferFlux's KV buffer at `max_num_seqs` (+ the prefix cache's slots), f16 K and V."""
    sequences = max_num_seqs + model["prefix_cache_slots"]
    return int(sequences * model["ctx_per_seq"] * model["kv_bytes_per_token"])


CHECKS: tuple[Check, ...] = (
    ("aggregate tok/s ≥ 1.0× llama-server at every concurrency", _every_level),
    (
        "TTFT p50 at concurrency 1 ≤ 1.1× llama-server (chat)",
        _pair("chat", 1, "llama-server", "ttft", 1.1),
    ),
    (
        "≥ 2× llama-cpp-python at concurrency 8 (chat)",
        _pair("chat", 8, "llama-cpp-python", "tok", 2.0),
    ),
    ("agent trace TTFT p50 ≤ 0.5× llama-server", _pair("agent", None, "llama-server", "ttft", 0.5)),
    ("server ≥ 0.9× engine ceiling (chat)", _vs_engine),
    ("peak RSS of the worker ≤ model file + KV + 300 MB", _memory),
)


def targets(rows: list[Row], model: dict[str, Any]) -> str:
    lines = ["| target | result | |", "| --- | --- | --- |"]
    for name, check in CHECKS:
        met, detail = check(rows, model)
        verdict = "not measured" if met is None else ("met" if met else "**missed**")
        lines.append(f"| {name} | {verdict} | {detail} |")
    return "\n".join(lines)
