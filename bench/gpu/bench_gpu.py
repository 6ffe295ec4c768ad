"""InferFlux vs llama-server on one model, one GPU: the same streaming load on both.

InferFlux is started once (all layers on the GPU, `max_num_seqs` = the largest level) and
`bench/serve_load.py` runs each concurrency level N against it. Then, for each llama-server
configuration (`--variant`; default: its defaults, and `--cache-ram 0`, which turns off
the host-RAM prompt cache that saves idle slots), llama-server is started per level with
`-np N` slots (continuous batching, all layers on the GPU, `-c N × ctx`) and measured at
that level. Each server has the machine to itself. Writes `<out>/<name>.json` (every
serve_load report, server commands, start-up times, GPU memory) and `<out>/<name>.md`, a
table with the ratios InferFlux / llama-server.

    python bench/gpu/bench_gpu.py --model /tmp/m.gguf --name llama7b \\
        --llama-server build/bin/llama-server --out results/ --levels 1,8,16,32,64

Any python with httpx runs it; InferFlux must be importable by `--python` (default: this
interpreter). A level that fails, times out or misses `--deadline` is recorded with its
error, never dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
SERVE_LOAD = HERE.parent / "serve_load.py"


@dataclass(frozen=True, slots=True)
class Bench:
    model: Path
    name: str
    llama_server: Path
    python: str
    levels: list[int]
    requests: int
    max_tokens: int
    ctx: int
    min_words: int
    max_words: int
    port: int
    out: Path
    level_timeout_s: float
    ngl: int
    max_batch_tokens: int
    deadline: float  # time.monotonic() after which no level starts
    variants: dict[str, list[str]]  # llama-server configurations: name -> extra flags


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> float:
    """Seconds until `url` answered 200; raises RuntimeError if it never did."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before ready")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def gpu_memory_mib() -> int | None:
    """GPU memory in use now (first GPU), or None without nvidia-smi."""
    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return int(text.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _serve_load(b: Bench, port: int, levels: list[int], tag: str) -> dict[str, Any]:
    """Run serve_load.py against the server on `port`; its JSON report, or an error."""
    path = b.out / f"{b.name}_{tag}.json"
    cmd = [
        *(sys.executable, str(SERVE_LOAD), "--url", f"http://127.0.0.1:{port}"),
        *("--concurrency", ",".join(map(str, levels)), "--requests", str(b.requests)),
        *("--max-tokens", str(b.max_tokens), "--json", str(path)),
        *("--min-words", str(b.min_words), "--max-words", str(b.max_words), "--timeout", "300"),
    ]
    try:
        done = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            timeout=b.level_timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"serve_load timed out after {b.level_timeout_s:.0f} s", "levels": []}
    print(done.stdout[-3000:], done.stderr[-2000:], sep="\n", flush=True)
    if not path.exists():
        return {"error": f"serve_load exit {done.returncode}: {done.stderr[-500:]}", "levels": []}
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    path.unlink()
    for level in report["levels"]:  # per-request rows without their ITL lists (size)
        for request in level.get("requests", []):
            request.pop("itl_s", None)
    return report


def llama_server_cmd(b: Bench, port: int, level: int, extra: list[str]) -> list[str]:
    return [
        *(str(b.llama_server), "-m", str(b.model), "--host", "127.0.0.1", "--port", str(port)),
        *("-ngl", str(b.ngl), "-np", str(level), "-c", str(level * b.ctx), "-cb"),
        *("-b", str(b.max_batch_tokens), *extra),
    ]


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`name=flags`: a llama-server configuration, e.g. `cram0=--cache-ram 0`."""
    name, _, flags = text.partition("=")
    if not name.isidentifier():
        raise argparse.ArgumentTypeError(f"need NAME=FLAGS, got {text!r}")
    return name, shlex.split(flags)


def _measure(b: Bench, cmd: list[str], env: dict[str, str], tag: str, port: int) -> dict[str, Any]:
    """Start a server, wait until ready, run serve_load level by level, stop it.

    Each level is its own serve_load run (a stuck level loses only itself); a level not
    started before the deadline is skipped and listed as such."""
    inferflux = tag == "inferflux"
    levels = b.levels if inferflux else [int(tag.rsplit("_", 1)[1])]
    ready_path = "/readyz" if inferflux else "/health"
    run: dict[str, Any] = {"cmd": cmd, "env": env, "report": {"levels": [], "errors": []}}
    with (b.out / f"{b.name}_{tag}.log").open("wb") as log:
        try:
            proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=log)
        except OSError as exc:
            run["report"]["error"] = f"cannot start {cmd[0]}: {exc}"
            return run
        try:
            run["ready_s"] = _wait_ready(f"http://127.0.0.1:{port}{ready_path}", proc, 300)
            for level in levels:
                _one_level(b, port, level, tag, run["report"])
            run["gpu_mem_mib"] = gpu_memory_mib()
        except RuntimeError as exc:
            run["report"]["error"] = str(exc)
        finally:
            _stop(proc)
    return run


def _one_level(b: Bench, port: int, level: int, tag: str, report: dict[str, Any]) -> None:
    if time.monotonic() > b.deadline:
        report["errors"].append(f"level {level} skipped: past the deadline")
        return
    one = _serve_load(b, port, [level], f"{tag}_{level}")
    if "error" in one:
        report["errors"].append(f"level {level}: {one['error']}")
    report["levels"] += one["levels"]
    report.setdefault("config", one.get("config"))


def run_llama_server(b: Bench, levels: list[int]) -> list[dict[str, Any]]:
    """Per variant, one llama-server per level (`-np` = the level), measured at that level."""
    runs = []
    for variant, extra in b.variants.items():
        for level in levels:
            if time.monotonic() > b.deadline:
                break
            cmd = llama_server_cmd(b, b.port, level, extra)
            tag = f"llama_server_{variant}_{level}"
            runs.append({"variant": variant, "level": level} | _measure(b, cmd, {}, tag, b.port))
    return runs


def inferflux_env(b: Bench) -> dict[str, str]:
    return {
        "INFERFLUX_RUNTIME__N_GPU_LAYERS": str(b.ngl if b.ngl >= 0 else -1),
        "INFERFLUX_SCHEDULER__MAX_NUM_SEQS": str(max(b.levels)),
        "INFERFLUX_SCHEDULER__MAX_BATCH_TOKENS": str(b.max_batch_tokens),
        "INFERFLUX_MODEL__CTX_SIZE": str(b.ctx),
        "INFERFLUX_OBSERVABILITY__LOG_LEVEL": "warning",
    }


def run_inferflux(b: Bench) -> dict[str, Any]:
    """One InferFlux server for every level."""
    port = b.port + 1
    code = "import sys; from inferflux.cli.serve import main; sys.exit(main())"
    cmd = [b.python, "-c", code, "serve", "--port", str(port), "--model", str(b.model)]
    return _measure(b, cmd, inferflux_env(b), "inferflux", port)


def _level(report: dict[str, Any], concurrency: int) -> dict[str, Any] | None:
    return next((lv for lv in report["levels"] if lv["concurrency"] == concurrency), None)


def _ms(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key)
    return "-" if value is None else f"{value * 1000:.1f}"


def _cells(lv: dict[str, Any] | None) -> list[str]:
    if lv is None:
        return ["failed"] * 5
    return [
        f"{lv['output_tok_s']:.1f}",
        f"{lv['request_tok_s']['mean']:.1f}",
        f"{_ms(lv['ttft_s'], 'p50')} / {_ms(lv['ttft_s'], 'p99')}",
        f"{_ms(lv['itl_s'], 'p50')} / {_ms(lv['itl_s'], 'p99')}",
        f"{lv['num_errors']}",
    ]


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> str:
    if a is None or b is None:
        return "-"
    x, y = a[key], b[key]
    x, y = (x["p50"], y["p50"]) if isinstance(x, dict) else (x, y)
    return f"**{x / y:.2f}**" if x and y else "-"


def markdown(result: dict[str, Any]) -> str:
    """Table: per level each llama-server variant, then InferFlux and its ratios to each."""
    head = (
        "| conc | server | out tok/s | req tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | errors |"
        " IF / LS out tok/s | IF / LS TTFT p50 |"
    )
    rows = [head, "| " + " | ".join(["---"] * 9) + " |"]
    inferflux = result["inferflux"]["report"]
    variants = list(dict.fromkeys(run.get("variant", "default") for run in result["llama_server"]))
    reports = {
        (r.get("variant", "default"), r["level"]): r["report"] for r in result["llama_server"]
    }
    for level in result["bench"]["levels"]:
        inf = _level(inferflux, level)
        ratios: list[list[str]] = [[], []]
        for variant in variants:
            ls = _level(reports.get((variant, level), {"levels": []}), level)
            label = "llama-server" + ("" if variant == "default" else f" ({variant})")
            rows.append("| " + " | ".join([str(level), label, *_cells(ls), "", ""]) + " |")
            ratios[0].append(_ratio(inf, ls, "output_tok_s"))
            ratios[1].append(_ratio(inf, ls, "ttft_s"))
        cells = [" / ".join(r) for r in ratios]
        rows.append("| " + " | ".join([str(level), "**InferFlux**", *_cells(inf), *cells]) + " |")
    return "\n".join(rows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--name", required=True, help="label of the results file")
    p.add_argument("--llama-server", type=Path, required=True)
    p.add_argument("--python", default=sys.executable, help="interpreter with inferflux")
    p.add_argument("--levels", default="1,8,16,32,64")
    p.add_argument("--requests", type=int, default=4, help="requests per client")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ctx", type=int, default=1024, help="context per sequence / slot")
    p.add_argument("--min-words", type=int, default=40)
    p.add_argument("--max-words", type=int, default=300)
    p.add_argument("--port", type=int, default=18250)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--level-timeout", type=float, default=240.0, help="s per level")
    p.add_argument("--ngl", type=int, default=99, help="GPU layers (-1/99 = all)")
    p.add_argument("--max-batch-tokens", type=int, default=2048)
    p.add_argument("--deadline", type=float, default=1800.0, help="s: start no level after")
    p.add_argument(
        "--variant",
        type=parse_variant,
        action="append",
        default=None,
        help="llama-server configuration NAME=FLAGS, repeatable "
        "(default: default= and cram0=--cache-ram 0)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    levels = [int(x) for x in a.levels.split(",")]
    b = Bench(
        *(a.model, a.name, a.llama_server, a.python, levels, a.requests, a.max_tokens, a.ctx),
        *(a.min_words, a.max_words, a.port, a.out, a.level_timeout, a.ngl, a.max_batch_tokens),
        time.monotonic() + a.deadline,
        dict(a.variant or [("default", []), ("cram0", ["--cache-ram", "0"])]),
    )
    b.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict[str, Any] = {"name": b.name, "model": str(b.model), "bench": _settings(b)}
    result["model_bytes"] = b.model.stat().st_size
    result["inferflux"] = run_inferflux(b)
    reached = [lv["concurrency"] for lv in result["inferflux"]["report"]["levels"]]
    result["llama_server"] = run_llama_server(b, [x for x in levels if x in reached] or levels)
    result["wall_s"] = time.monotonic() - started
    (b.out / f"{b.name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    table = markdown(result)
    (b.out / f"{b.name}.md").write_text(table + "\n", encoding="utf-8")
    print(table, flush=True)
    return 0


def _settings(b: Bench) -> dict[str, Any]:
    return {
        "levels": b.levels,
        "requests_per_client": b.requests,
        "max_tokens": b.max_tokens,
        "ctx_per_seq": b.ctx,
        "prompt_words": [b.min_words, b.max_words],
        "ngl": b.ngl,
        "max_batch_tokens": b.max_batch_tokens,
        "llama_server_variants": b.variants,
    }


if __name__ == "__main__":
    sys.exit(main())
