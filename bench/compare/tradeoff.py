"""Issue 21's table: every InferFlux setting against llama-server, over alternated passes.

Each pass is one `compare_servers.py` run (llama-server and InferFlux variants side by
side, `--variant NAME:ENV=VALUE`); passes alternate the servers' order. Per model, level
and setting: tok/s, TTFT p50 and ITL p99 as ratios to llama-server's in the same pass
(one figure per pass), and whether the issue's targets hold in every pass:
ITL p99 ≤ 2× llama-server's; TTFT p50 ≤ 0.7× at c ≥ 4 and ≤ 1.05× at c = 1; tok/s ≥ 1.0×.

    .venv/bin/python bench/compare/tradeoff.py pass1.json pass2.json [--markdown out.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

Row = dict[str, Any]
BASE = "llama-server"


def _index(result: dict[str, Any]) -> dict[tuple[str, str, int], Row]:
    return {
        (key, row["server"], row["concurrency"]): row
        for key, entry in result["models"].items()
        for row in entry["rows"]
        if row["workload"] == "chat"
    }


def _ratios(ours: Row, base: Row) -> tuple[float, float, float]:
    return (
        ours["output_tok_s"] / base["output_tok_s"],
        ours["ttft_s"]["p50"] / base["ttft_s"]["p50"],
        ours["itl_s"]["p99"] / base["itl_s"]["p99"],
    )


def _met(level: int, ratios: list[tuple[float, float, float]]) -> str:
    ttft_limit = 1.05 if level == 1 else 0.7
    checks = [
        ("tok/s", all(r[0] >= 1.0 for r in ratios)),
        ("TTFT", all(r[1] <= ttft_limit for r in ratios)),
        ("ITL", all(r[2] <= 2.0 for r in ratios)),
    ]
    missed = [name for name, ok in checks if not ok]
    return "all met" if not missed else "missed: " + ", ".join(missed)


def _fmt(values: list[float], digits: int = 2) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values)


def table(passes: list[dict[str, Any]]) -> str:
    indexes = [_index(p) for p in passes]
    keys = sorted({(m, s, c) for ix in indexes for (m, s, c) in ix if s != BASE})
    lines = [
        "| model | c | setting | tok/s | ÷ llama-server | TTFT p50 ms | ÷ llama-server "
        "| ITL p99 ms | ÷ llama-server | targets |",
        "| --- | ---: | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, server, level in sorted(keys, key=lambda k: (k[0], k[2], k[1])):
        pairs = [
            (ix[(model, server, level)], ix[(model, BASE, level)])
            for ix in indexes
            if (model, server, level) in ix and (model, BASE, level) in ix
        ]
        if not pairs:
            continue
        ratios = [_ratios(ours, base) for ours, base in pairs]
        lines.append(
            f"| {model} | {level} | {server} "
            f"| {_fmt([o['output_tok_s'] for o, _ in pairs], 1)} "
            f"| {_fmt([r[0] for r in ratios])} "
            f"| {_fmt([o['ttft_s']['p50'] * 1000 for o, _ in pairs], 0)} "
            f"| {_fmt([r[1] for r in ratios])} "
            f"| {_fmt([o['itl_s']['p99'] * 1000 for o, _ in pairs], 0)} "
            f"| {_fmt([r[2] for r in ratios])} | {_met(level, ratios)} |"
        )
    bases = sorted({(m, c) for ix in indexes for (m, s, c) in ix if s == BASE})
    lines += ["", "| model | c | llama-server tok/s | TTFT p50 ms | ITL p99 ms |",
              "| --- | ---: | --- | --- | --- |"]  # fmt: skip
    for model, level in bases:
        rows = [ix[(model, BASE, level)] for ix in indexes if (model, BASE, level) in ix]
        lines.append(
            f"| {model} | {level} | {_fmt([r['output_tok_s'] for r in rows], 1)} "
            f"| {_fmt([r['ttft_s']['p50'] * 1000 for r in rows], 0)} "
            f"| {_fmt([r['itl_s']['p99'] * 1000 for r in rows], 0)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("passes", type=Path, nargs="+", help="compare_servers.py --json outputs")
    p.add_argument("--markdown", type=Path, default=None)
    args = p.parse_args(argv)
    text = table([json.loads(path.read_text(encoding="utf-8")) for path in args.passes])
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
