"""bench/compare: the report's ratios and targets, the per-level plan, server command lines,
and the process-tree memory sampler (on this test's own process)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
report = importlib.import_module("compare.report")
rss = importlib.import_module("compare.rss")
servers = importlib.import_module("compare.servers")
workloads = importlib.import_module("compare.workloads")

MB = 1024 * 1024


def _row(server, workload, concurrency, tok_s, ttft_s, rss_bytes=None):
    summary = {"p50": ttft_s, "p99": ttft_s, "mean": ttft_s, "count": 1}
    return {
        "server": server,
        "workload": workload,
        "concurrency": concurrency,
        "output_tok_s": tok_s,
        "request_tok_s": {"mean": tok_s / concurrency},
        "ttft_s": summary,
        "itl_s": summary,
        "num_errors": 0,
        "num_requests": 4,
        "num_short": 0,
        "rss_tree_bytes": rss_bytes,
        "rss_largest_process_bytes": rss_bytes,
    }


MODEL = {"file_bytes": 100 * MB, "ctx_per_seq": 1024, "kv_bytes_per_token": 1024,
         "prefix_cache_slots": 8}  # fmt: skip


def _rows():
    return [
        _row("inferflux", "chat", 1, 110.0, 0.20, 500 * MB),
        _row("llama-server", "chat", 1, 100.0, 0.25),
        _row("llama-cpp-python", "chat", 1, 50.0, 0.30),
        _row("engine", "chat", 1, 115.0, 0.18),
        _row("inferflux", "chat", 8, 150.0, 1.0, 420 * MB),
        _row("llama-server", "chat", 8, 160.0, 1.2),
        _row("llama-cpp-python", "chat", 8, 40.0, 5.0),
        _row("engine", "chat", 8, 200.0, 0.9),
        _row("inferflux", "agent", 4, 90.0, 0.10),
        _row("llama-server", "agent", 4, 80.0, 0.40),
    ]


def test_ratios_are_inferflux_over_the_other_server():
    rows = _rows()
    ours = report.find(rows, "inferflux", "chat", 1)
    assert report.tok_ratio(ours, report.find(rows, "llama-server", "chat", 1)) == 1.1
    assert report.ttft_ratio(ours, report.find(rows, "llama-server", "chat", 1)) == 0.8
    assert report.tok_ratio(ours, None) is None
    assert report.find(rows, "inferflux", "agent", None)["concurrency"] == 4


def test_the_table_has_one_row_per_result_and_ratios_on_inferflux_rows():
    lines = report.table(_rows()).splitlines()
    assert len(lines) == 2 + len(_rows())
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    first = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    assert first[:3] == ["chat", "1", "inferflux"]
    assert first[10] == "500"  # MB
    assert first[11] == "1.10× · TTFT 0.80×"
    assert first[12] == "2.20× · TTFT 0.67×"
    assert lines[3].split("|")[12].strip() == ""  # no ratio on llama-server's row


def test_targets_name_what_was_met_and_missed():
    text = report.targets(_rows(), MODEL)
    lines = {line.split("|")[1].strip(): line for line in text.splitlines()[2:]}
    assert "**missed**" in lines["aggregate tok/s ≥ 1.0× llama-server at every concurrency"]
    assert "0.94× (chat c=8)" in lines["aggregate tok/s ≥ 1.0× llama-server at every concurrency"]
    assert "| met |" in lines["TTFT p50 at concurrency 1 ≤ 1.1× llama-server (chat)"]
    assert "3.75×" in lines["≥ 2× llama-cpp-python at concurrency 8 (chat)"]
    assert "0.25×" in lines["agent trace TTFT p50 ≤ 0.5× llama-server"]
    assert "**missed**" in lines["server ≥ 0.9× engine ceiling (chat)"]  # 150 / 200
    # budget at c=1: 100 MB + (1 + 8) × 1024 × 1024 B + 300 MB = 409 MB < 500 MB
    assert "**missed**" in lines["peak RSS of the worker ≤ model file + KV + 300 MB"]


def test_targets_without_the_other_servers_are_not_measured():
    only_ours = [r for r in _rows() if r["server"] == "inferflux"]
    assert report.targets(only_ours, MODEL).count("not measured") >= 4


@pytest.mark.parametrize(("concurrency", "expected"), [(1, 8), (4, 2), (8, 2), (32, 2)])
def test_low_levels_send_more_requests_per_client(concurrency, expected):
    assert workloads.Plan(requests_per_client=2, min_requests=8).per_client(concurrency) == expected


def _model(template=None):
    text = "{{ bos_token }}{{ messages[0]['content'] }}" if template else None
    return servers.Model("m", "/models/m.gguf", template, text, (1, 106), 1024)


def test_llama_server_gets_one_slot_per_client_and_the_same_context_per_slot():
    tools = servers.Toolchain("/bin/llama-server", "/venv/bin/python")
    server = servers.make_server("llama-server", tools, _model("gemma"), 18100, 8)
    argv = server.argv
    assert argv[argv.index("-np") + 1] == "8"
    assert argv[argv.index("-c") + 1] == str(8 * servers.CTX_PER_SEQ)
    assert argv[argv.index("-t") + 1] == "2"
    template = Path(argv[argv.index("--chat-template-file") + 1])
    assert template.read_text() == "{{ bos_token }}{{ messages[0]['content'] }}"
    assert server.ready_path == "/health" and server.ignore_eos


def test_llama_cpp_python_bans_end_of_generation_tokens_instead_of_ignore_eos():
    tools = servers.Toolchain(None, "/venv/bin/python")
    server = servers.make_server("llama-cpp-python", tools, _model(), 18100, 8)
    assert "--interrupt_requests" in server.argv and "--chat_format" not in server.argv
    assert not server.ignore_eos
    assert servers.request_extras(server, _model()) == {"logit_bias": {"1": -100, "106": -100}}
    with pytest.raises(ValueError, match="unbuilt"):
        servers.make_server("llama-server", tools, _model(), 18100, 8)


def test_inferflux_is_configured_by_environment():
    server = servers.make_server("inferflux", servers.Toolchain(None, None), _model(), 18100, 32)
    assert server.env["INFERFLUX_SCHEDULER__MAX_NUM_SEQS"] == "32"
    assert server.argv[1:3] == ["serve", "--host"]
    assert servers.request_extras(server, _model()) == {}


def test_the_sampler_sees_a_child_process_and_keeps_the_peak():
    code = "import time; b = b'x' * (64 << 20); print(flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # its 64 MB are resident
        sampler = rss.TreeSampler(os.getpid(), interval_s=0.05)
        assert rss.tree(os.getpid())[child.pid].startswith("python")
        time.sleep(0.3)
        peak = sampler.stop()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert peak.tree >= rss.rss_bytes(os.getpid()) + 60 * MB
    child_peak = [v for k, v in peak.per_process.items() if k.endswith(f"[{child.pid}]")]
    assert child_peak and child_peak[0] >= 60 * MB
    assert rss.rss_bytes(child.pid) == 0  # reaped: /proc has no entry


def test_the_agent_corpus_can_fold_its_system_prompt_into_the_first_turn():
    plain = workloads.agent_corpus(workloads.Plan(agent_turns=2), fold_system=False)
    folded = workloads.agent_corpus(workloads.Plan(agent_turns=2), fold_system=True)
    assert len(plain) == len(folded) == 4
    assert all(len(c["turns"]) == 2 for c in plain)
    assert folded[0]["system"] is None
    first = folded[0]["turns"][0]["content"]
    assert first == plain[0]["system"] + "\n\n" + plain[0]["turns"][0]["content"]
    assert folded[0]["turns"][1] == plain[0]["turns"][1]
    assert len(workloads.agent_corpus(workloads.Plan(), False)[0]["turns"]) == 6


def _result(command, rows, loadavg, llama_server=None):
    return {
        "meta": {
            "command": command,
            "machine": {"loadavg_start": loadavg, "loadavg_end": loadavg},
            "toolchain": {"llama_server": llama_server, "llama_cpp_python_venv": None},
        },
        "models": {"smollm2": {"model": MODEL, "rows": rows}},
    }


def test_merge_joins_runs_into_one_report_with_ratios_across_them(tmp_path):
    import json  # noqa: PLC0415

    runner = importlib.import_module("compare.runner")
    rows = _rows()
    lcp = [r for r in rows if r["server"] == "llama-cpp-python"]
    others = [r for r in rows if r["server"] != "llama-cpp-python"]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    build = {"binary": "/x/llama-server", "llama_cpp_python": "0.3.36"}
    first.write_text(json.dumps(_result("run a", others, [1.0, 1, 1], build)))
    second.write_text(json.dumps(_result("run b", lcp, [2.0, 2, 2])))
    merged = runner.merged([first, second])
    assert merged["meta"]["command"] == "run a + run b"
    assert merged["meta"]["machine"]["loadavg_end"] == [2.0, 2, 2]
    assert merged["meta"]["toolchain"]["llama_server"] == build
    got = merged["models"]["smollm2"]["rows"]
    assert len(got) == len(rows)
    order = [(r["workload"], r["concurrency"], r["server"]) for r in got]
    assert order[:4] == [("chat", 1, "inferflux"), ("chat", 1, "llama-server"),
                         ("chat", 1, "llama-cpp-python"), ("chat", 1, "engine")]  # fmt: skip
    assert order[-1][0] == "agent"
    # the ≥ 2× llama-cpp-python target now sees both runs: 150 / 40
    assert "3.75×" in report.targets(got, MODEL)


def test_a_variant_is_inferflux_with_its_environment_and_gets_ratios():
    runner = importlib.import_module("compare.runner")
    envs = runner.variant_envs(["r2:INFERFLUX_SCHEDULER__ITL_TARGET_RATIO=2,A=b"])
    assert envs == {"inferflux-r2": {"INFERFLUX_SCHEDULER__ITL_TARGET_RATIO": "2", "A": "b"}}
    with pytest.raises(SystemExit):
        runner.variant_envs(["r2"])
    rows = [_row("inferflux-r2", "chat", 8, 90.0, 1.0), _row("llama-server", "chat", 8, 100.0, 2.0)]
    assert "0.90× · TTFT 0.50×" in report.table(rows)


def test_the_tradeoff_table_checks_every_pass_against_llama_server():
    tradeoff = importlib.import_module("compare.tradeoff")

    def result(ours_tok_s, ours_itl_s):
        ours = _row("inferflux-r2", "chat", 8, ours_tok_s, 1.0)
        ours["itl_s"] = {"p99": ours_itl_s}
        base = _row("llama-server", "chat", 8, 100.0, 2.0)
        base["itl_s"] = {"p99": 0.1}
        return {"models": {"smollm2": {"rows": [ours, base]}}}

    text = tradeoff.table([result(101.0, 0.15), result(99.0, 0.25)])
    line = next(t for t in text.splitlines() if "inferflux-r2" in t)
    assert "| 1.01 / 0.99 |" in line and "| 1.50 / 2.50 |" in line
    assert line.endswith("missed: tok/s, ITL |")  # the second pass misses both
    assert "all met" in tradeoff.table([result(101.0, 0.15)])
