"""`make bench`: every server benchmark, one after another, results under bench/results/.

Runs compare_servers.py (InferFlux vs llama-server vs llama-cpp-python, both test models),
server_vs_engine.py (throughput vs the engine ceiling), agent_trace.py (prefix cache on vs
off), priority_load.py (mixed priority and overload), responses_ws.py (the Responses API's
tool-call loop over HTTP and WebSocket), grpc_overhead.py (gRPC vs SSE per token, c=1 and
16), constrained.py (JSON-schema
constrained vs free decoding, both test models) and dry_json.py (the contract corpus's
schema-valid rate with and without DRY). Each starts its own servers. Run on a
quiet machine; append the figures to BENCHMARKS.md by hand with the machine description.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

RUNS = [
    ["compare_servers.py"],
    ["server_vs_engine.py", "--json", str(RESULTS / "server_vs_engine_smollm2.json")],
    ["agent_trace.py", "--json", str(RESULTS / "agent_trace_smollm2.json")],
    ["priority_load.py", "--json", str(RESULTS / "priority_load_smollm2.json")],
    ["responses_ws.py", "--json", str(RESULTS / "responses_ws.json")],
    ["grpc_overhead.py", "--json", str(RESULTS / "grpc_overhead.json")],
    [
        "constrained.py",
        "--json",
        str(RESULTS / "constrained.json"),
        "--markdown",
        str(RESULTS / "constrained.md"),
    ],
    [
        "dry_json.py",
        "--json",
        str(RESULTS / "dry_json.json"),
        "--markdown",
        str(RESULTS / "dry_json.md"),
    ],
]


def main() -> int:
    RESULTS.mkdir(exist_ok=True)
    failed = 0
    for args in RUNS:
        print(f"== {' '.join(args)}", flush=True)
        failed += subprocess.call([sys.executable, *args], cwd=HERE) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
