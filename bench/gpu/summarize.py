"""Markdown summary of a GPU benchmark run: the device, then one table per model.

    python bench/gpu/summarize.py RESULTS_DIR > summary.md

Reads the `<name>.json` files that bench_gpu.py wrote and `env.txt` (nvidia-smi output).
For every model it checks the spec's GPU targets (written for a 7B Q4_K model): a level
where every request streams at ≥ 30 tok/s on average while the server delivers
≥ 400 tok/s in aggregate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench_gpu import markdown

PER_REQUEST_TARGET = 30.0
AGGREGATE_TARGET = 400.0


def device_line(results: Path) -> str:
    """The GPU line of nvidia-smi's CSV query in env.txt, or a note that it is missing."""
    env = results / "env.txt"
    if not env.exists():
        return "device: unknown (no env.txt)"
    lines = env.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("name, memory.total") and i + 1 < len(lines):
            return f"device: {lines[i + 1]} ({line})"
    return "device: unknown (nvidia-smi gave no CSV line)"


def targets(levels: list[dict[str, Any]]) -> str:
    """Which levels meet both spec targets at once."""
    met = [
        lv["concurrency"]
        for lv in levels
        if lv["request_tok_s"]["mean"] is not None
        and lv["request_tok_s"]["mean"] >= PER_REQUEST_TARGET
        and lv["output_tok_s"] >= AGGREGATE_TARGET
        and lv["num_errors"] == 0
    ]
    best = max(levels, key=lambda lv: lv["output_tok_s"], default=None)
    peak = f"peak {best['output_tok_s']:.0f} tok/s at {best['concurrency']}" if best else "none"
    both = ", ".join(map(str, met)) if met else "none"
    goal = f"≥ {PER_REQUEST_TARGET:.0f} tok/s per request and ≥ {AGGREGATE_TARGET:.0f} aggregate"
    return f"levels meeting {goal}: {both} ({peak})"


def model_section(result: dict[str, Any]) -> list[str]:
    inferflux = result["inferflux"]
    variants: dict[str, list[dict[str, Any]]] = {}
    for run in result["llama_server"]:
        variants.setdefault(run.get("variant", "default"), []).append(run)
    lines = [
        f"### {result['name']}: {result['model']} ({result['model_bytes'] / 2**30:.2f} GiB)",
        "",
        markdown(result),
        "",
        f"- InferFlux: {targets(inferflux['report']['levels'])}",
    ]
    for variant, runs in variants.items():
        levels = [lv for run in runs for lv in run["report"]["levels"]]
        lines.append(f"- llama-server ({variant}): {targets(levels)}")
    lines.append(
        f"- GPU memory in use: InferFlux {inferflux.get('gpu_mem_mib')} MiB (ready after "
        f"{inferflux.get('ready_s', float('nan')):.1f} s); llama-server per level: "
        + ", ".join(
            f"{r['level']}: {r.get('gpu_mem_mib')} MiB" for r in variants.get("default", [])
        )
    )
    reports = [inferflux["report"], *(r["report"] for r in result["llama_server"])]
    errors = [e for r in reports for e in [r.get("error"), *r.get("errors", [])] if e]
    if errors:
        lines.append(f"- errors: {errors}")
    return lines


def main(argv: list[str]) -> int:
    results = Path(argv[1])
    out = [f"## GPU run ({device_line(results)})", ""]
    for path in sorted(results.glob("*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(result, dict) and "llama_server" in result:
            out += model_section(result) + [""]
    skipped = results / "skipped.txt"
    if skipped.exists():
        out.append(skipped.read_text(encoding="utf-8"))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
