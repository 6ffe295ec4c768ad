"""bench/gpu: the report logic (tables, ratios, spec targets, llama-server variants)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

GPU = Path(__file__).resolve().parents[3] / "bench" / "gpu"


def _import_gpu(name: str) -> Any:
    for path in (GPU, GPU.parent):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    return importlib.import_module(name)


bench_gpu = _import_gpu("bench_gpu")
summarize = _import_gpu("summarize")


def _level(concurrency: int, out: float, req: float, ttft: float, errors: int = 0) -> dict:
    return {
        "concurrency": concurrency,
        "output_tok_s": out,
        "request_tok_s": {"mean": req},
        "ttft_s": {"p50": ttft, "p99": ttft * 2},
        "itl_s": {"p50": 0.01, "p99": 0.02},
        "num_errors": errors,
    }


def _result() -> dict:
    return {
        "name": "m",
        "model": "/m.gguf",
        "model_bytes": 2**30,
        "bench": {"levels": [1, 8]},
        "inferflux": {"report": {"levels": [_level(1, 200, 200, 0.04), _level(8, 600, 75, 0.3)]}},
        "llama_server": [
            {"variant": "default", "level": 1, "report": {"levels": [_level(1, 100, 100, 0.1)]}},
            {"variant": "default", "level": 8, "report": {"levels": [], "error": "boom"}},
            {"variant": "cram0", "level": 1, "report": {"levels": [_level(1, 250, 250, 0.02)]}},
            {"variant": "cram0", "level": 8, "report": {"levels": [_level(8, 500, 60, 0.2)]}},
        ],
    }


def test_markdown_has_a_row_per_server_and_level_and_ratios_against_each_variant() -> None:
    table = bench_gpu.markdown(_result()).splitlines()
    assert len(table) == 2 + 2 * 3  # header, rule, per level: 2 variants + InferFlux
    assert table[2].startswith("| 1 | llama-server | 100.0 | 100.0 | 100.0 / 200.0 |")
    assert table[3].startswith("| 1 | llama-server (cram0) | 250.0 |")
    row = table[4]
    assert row.startswith("| 1 | **InferFlux** | 200.0 | 200.0 | 40.0 / 80.0 |")
    assert row.endswith("| **2.00** / **0.80** | **0.40** / **2.00** |")
    assert "| 8 | llama-server | failed |" in table[5]  # the failed level stays visible
    assert table[7].endswith("| - / **1.20** | - / **1.50** |")


def test_targets_need_both_per_request_and_aggregate_without_errors() -> None:
    levels = [
        _level(1, 232, 232, 0.04),  # aggregate too low
        _level(8, 642, 80, 0.3),  # met
        _level(32, 1198, 37.7, 0.6, errors=1),  # errors disqualify
        _level(64, 1341, 21.3, 0.6),  # per request too low
    ]
    text = summarize.targets(levels)
    assert ": 8 (peak 1341 tok/s at 64)" in text
    assert summarize.targets([]).endswith("none (none)")


def test_model_section_lists_targets_per_variant_and_errors() -> None:
    lines = summarize.model_section(_result())
    assert lines[0] == "### m: /m.gguf (1.00 GiB)"
    assert any(line.startswith("- llama-server (default): ") for line in lines)
    assert any(line.startswith("- llama-server (cram0): ") for line in lines)
    assert lines[-1] == "- errors: ['boom']"


def test_parse_variant_splits_flags_and_rejects_a_bad_name() -> None:
    assert bench_gpu.parse_variant("cram0=--cache-ram 0") == ("cram0", ["--cache-ram", "0"])
    assert bench_gpu.parse_variant("default=") == ("default", [])
    with pytest.raises(argparse.ArgumentTypeError):
        bench_gpu.parse_variant("no name")


def test_llama_server_command_sizes_the_context_by_slots() -> None:
    b = bench_gpu.Bench(
        *(Path("/m.gguf"), "m", Path("/bin/llama-server"), "python", [1, 8], 4, 128, 1024),
        *(40, 300, 18250, Path("/tmp"), 180.0, 99, 2048, 0.0, {}),
    )
    cmd = bench_gpu.llama_server_cmd(b, 18250, 8, ["--cache-ram", "0"])
    assert cmd[cmd.index("-np") + 1] == "8"
    assert cmd[cmd.index("-c") + 1] == str(8 * 1024)
    assert cmd[-2:] == ["--cache-ram", "0"]
