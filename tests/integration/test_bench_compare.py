"""The comparison harness (bench/compare) end to end at CI size: a real InferFlux server
and the in-process engine ceiling, concurrency 1, two short requests per endpoint, two
agent turns. llama-server (minutes to build) and llama-cpp-python are left to `make bench`."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tests.integration.server_process import free_port

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
runner = importlib.import_module("compare.runner")

pytestmark = [pytest.mark.model, pytest.mark.server, pytest.mark.timeout(600)]


def test_a_one_level_comparison_writes_rows_table_and_targets(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "compare.json", tmp_path / "compare.md"
    code = runner.main(
        ["--models", "smollm2", "--servers", "inferflux,engine", "--levels", "1"]
        + ["--requests", "1", "--min-requests", "2", "--max-tokens", "8"]
        + ["--agent-turns", "2", "--agent-max-tokens", "8", "--port", str(free_port())]
        + ["--json", str(out_json), "--markdown", str(out_md)]
    )
    assert code == 0
    result = json.loads(out_json.read_text())
    rows = result["models"]["smollm2"]["rows"]
    kinds = [(r["server"], r["workload"]) for r in rows]
    assert kinds == [
        ("inferflux", "chat"),
        ("engine", "chat"),
        ("inferflux", "completions"),
        ("inferflux", "agent"),
    ]
    for row in rows:
        assert row["num_errors"] == 0, row["errors"]
        assert row["output_tok_s"] > 0 and row["ttft_s"]["p50"] > 0
    stream = [r for r in rows if r["workload"] != "agent"]
    assert all(r["num_requests"] == 2 and r["output_tokens"] == 16 for r in stream)
    agent = rows[-1]
    assert agent["num_requests"] == 4 * 2  # 4 conversations × 2 turns
    assert agent["cached_tokens"] > 0  # turn 2 reuses turn 1 (and the shared system prompt)
    served = [r for r in rows if r["server"] == "inferflux"]
    assert all(r["rss_largest_process_bytes"] > 50 * 1024 * 1024 for r in served)
    text = out_md.read_text()
    assert "| chat | 1 | inferflux |" in text
    assert "server ≥ 0.9× engine ceiling (chat)" in text
    assert "not measured" in text  # no llama-server in this run
