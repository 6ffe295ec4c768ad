"""The command line: which servers, models, levels and workloads; one table per model.

Levels run in the outer loop and servers in the inner one, so the rows a ratio compares
were measured minutes apart, not an hour apart. Each server is started fresh for every
level with `parallel` = that level's concurrency (llama-server's `-np`), and again for the
agent trace (parallel = its conversations).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from compare import report, toolchain, workloads
from compare.models import MODELS, load_model
from compare.servers import (
    CTX_PER_SEQ,
    SERVERS,
    Model,
    Toolchain,
    make_server,
    request_extras,
    running,
)
from inferflux.config import load_settings
from inferflux.config.settings import prefix_cache_slots
from serve_load import parse_levels

RESULTS = Path(__file__).resolve().parents[1] / "results"
LOGS = toolchain.CACHE / "logs"
_ORDER = {name: i for i, name in enumerate((*SERVERS, "engine"))}
_WORKLOADS = {"chat": 0, "completions": 1, "agent": 2}


def _rank(server: str) -> tuple[int, str]:
    """Variants (inferflux-NAME) right after inferflux."""
    if server.startswith("inferflux-"):
        return _ORDER["inferflux"], server
    return _ORDER.get(server, len(_ORDER)), ""


def _names(choices: tuple[str, ...], variants: bool = False) -> Any:  # Any: argparse type
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [
            n for n in names if n not in choices and not (variants and n.startswith("inferflux-"))
        ]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}: {text!r}")
        return names

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="InferFlux vs llama-server vs llama-cpp-python")
    p.add_argument("--models", type=_names(MODELS), default=list(MODELS))
    p.add_argument(
        "--servers",
        type=_names((*SERVERS, "engine"), variants=True),
        default=[*SERVERS, "engine"],
        help="also inferflux-NAME for each --variant NAME",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:ENV=VALUE[,ENV=VALUE]",
        help="the server inferflux-NAME: inferflux with these environment variables "
        "(e.g. stallfree:INFERFLUX_SCHEDULER__ITL_TARGET_RATIO=2)",
    )
    p.add_argument("--levels", type=parse_levels, default=[1, 4, 8, 16, 32])
    p.add_argument(
        "--endpoints", type=_names(("chat", "completions")), default=["chat", "completions"]
    )
    p.add_argument("--no-agent", action="store_true", help="skip the agent-trace workload")
    p.add_argument("--requests", type=int, default=2, help="requests per client per level")
    p.add_argument("--min-requests", type=int, default=8, help="at least this many per level")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--agent-max-tokens", type=int, default=48, help="tokens per agent answer")
    p.add_argument("--agent-turns", type=int, default=None, help="replay only the first N turns")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp threads of every server")
    p.add_argument("--port", type=int, default=18110)
    p.add_argument("--json", type=Path, default=RESULTS / "compare.json")
    p.add_argument("--markdown", type=Path, default=RESULTS / "compare.md")
    p.add_argument("--append", type=Path, default=None, help="append the markdown here too")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="run nothing: join the rows of these result JSONs (runs of different servers "
        "or levels on the same machine) into one report, ratios across them",
    )
    return p


def _tools(servers: list[str]) -> tuple[Toolchain, dict[str, Any]]:
    build = toolchain.llama_server() if "llama-server" in servers else None
    python = toolchain.llama_cpp_python_server() if "llama-cpp-python" in servers else None
    info = {
        "llama_server": dataclasses.asdict(build) if build else None,
        "llama_cpp_python_venv": python,
    }
    return Toolchain(build.binary if build else None, python), info


def _log(row: dict[str, Any]) -> None:
    ttft = row["ttft_s"].get("p50") or 0.0
    print(
        f"  {row['server']:>16} {row['workload']:>11} c={row['concurrency']:<3} "
        f"{row['output_tok_s']:7.1f} tok/s  TTFT p50 {ttft * 1000:6.0f} ms  "
        f"errors {row['num_errors']}/{row['num_requests']}  "
        f"prompt tokens {row['prompt_tokens_mean'] or 0:.0f}",
        flush=True,
    )


def variant_envs(specs: list[str]) -> dict[str, dict[str, str]]:
    """`--variant NAME:ENV=VALUE,...` → {"inferflux-NAME": {ENV: VALUE, ...}}."""
    out: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, _, pairs = spec.partition(":")
        env = dict(pair.split("=", 1) for pair in pairs.split(",") if "=" in pair)
        if not name or not env:
            raise SystemExit(f"--variant NAME:ENV=VALUE[,ENV=VALUE]: {spec!r}")
        out[f"inferflux-{name}"] = env
    return out


def _serve(name: str, tools: Toolchain, model: Model, parallel: int, args: Any, tag: str) -> Any:
    env = variant_envs(args.variant).get(name)
    server = make_server(
        "inferflux" if env else name, tools, model, args.port, parallel, args.threads
    )
    if env:
        server = dataclasses.replace(server, name=name, env={**server.env, **env})
    return server, running(server, args.port, LOGS / f"{model.key}-{name}-{tag}.log")


def _level_rows(
    model: Model, tools: Toolchain, args: Any, plan: workloads.Plan, level: int
) -> list[dict[str, Any]]:
    """Every server's rows at one concurrency level, servers one after another."""
    rows = []
    for name in args.servers:
        if name == "engine":
            new = [workloads.engine(model.path, plan, level)]
        else:
            server, started = _serve(name, tools, model, level, args, f"c{level}")
            extra = request_extras(server, model)
            with started as run:
                new = asyncio.run(workloads.stream(run, args.endpoints, plan, level, extra))
        for row in new:
            rows.append(row | {"server": name})
            _log(rows[-1])
    return rows


def _agent_rows(
    model: Model, tools: Toolchain, args: Any, plan: workloads.Plan
) -> list[dict[str, Any]]:
    rows = []
    fold = model.template_text is not None  # see compare.servers: the same text everywhere
    for name in [s for s in args.servers if s != "engine"]:
        server, started = _serve(name, tools, model, 4, args, "agent")
        with started as run:
            row = asyncio.run(workloads.agent(run, plan, request_extras(server, model), fold))
        rows.append(row | {"server": name})
        _log(rows[-1])
    return rows


def run_model(model: Model, tools: Toolchain, args: Any) -> list[dict[str, Any]]:  # Any: argparse
    plan = workloads.Plan(
        args.requests,
        args.min_requests,
        args.max_tokens,
        args.agent_max_tokens,
        args.agent_turns,
        threads=args.threads,
    )
    rows = [row for level in args.levels for row in _level_rows(model, tools, args, plan, level)]
    if not args.no_agent:
        rows += _agent_rows(model, tools, args, plan)
    rows.sort(key=lambda r: (_WORKLOADS[r["workload"]], r["concurrency"], _rank(r["server"])))
    return rows


def _model_meta(model: Model) -> dict[str, Any]:
    settings = load_settings(env={})
    slots = prefix_cache_slots(settings.runtime, settings.scheduler.prefix_cache)
    return dataclasses.asdict(model) | {
        "file_bytes": model.file_bytes,
        "ctx_per_seq": CTX_PER_SEQ,
        "prefix_cache_slots": slots,
    }


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    build = meta["toolchain"]["llama_server"] or {}
    lines = [
        f"## {meta['date']} — InferFlux vs llama-server vs llama-cpp-python (bench/compare)",
        "",
        f"`{meta['command']}`; load average {meta['machine']['loadavg_start'][0]:.1f} at the "
        f"start, {meta['machine']['loadavg_end'][0]:.1f} at the end; llama.cpp from the "
        f"llama-cpp-python {build.get('llama_cpp_python', '?')} sdist "
        f"(llama.cpp commit {build.get('llama_cpp_commit', '?')}, "
        f"ggml {build.get('ggml_version', '?')}, "
        f"sdist sha256 {str(build.get('sdist_sha256', '?'))[:12]}…).",
    ]
    for key, entry in result["models"].items():
        lines += [
            "",
            f"### {key}: {Path(entry['model']['path']).name}",
            "",
            report.table(entry["rows"]),
        ]
        lines += ["", report.targets(entry["rows"], entry["model"])]
    return "\n".join(lines) + "\n"


def merged(paths: list[Path]) -> dict[str, Any]:
    """One result from several: the first one's meta (commands joined), every model's rows."""
    results = [json.loads(path.read_text(encoding="utf-8")) for path in paths]
    out: dict[str, Any] = {"meta": dict(results[0]["meta"]), "models": {}}
    out["meta"]["command"] = " + ".join(r["meta"]["command"] for r in results)
    out["meta"]["machine"] = dict(out["meta"]["machine"])
    out["meta"]["machine"]["loadavg_end"] = results[-1]["meta"]["machine"]["loadavg_end"]
    for result in results:
        if result["meta"]["toolchain"].get("llama_server"):
            out["meta"]["toolchain"] = result["meta"]["toolchain"]
        for key, entry in result["models"].items():
            into = out["models"].setdefault(key, {"model": entry["model"], "rows": []})
            into["rows"].extend(entry["rows"])
    for entry in out["models"].values():
        entry["rows"].sort(
            key=lambda r: (r["workload"] == "agent", r["workload"], r["concurrency"] or 0,
                           _rank(r["server"]))
        )  # fmt: skip
    return out


def _write(result: dict[str, Any], args: Any) -> None:  # Any: argparse
    text = markdown(result)
    print("\n" + text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    args.markdown.write_text(text, encoding="utf-8")
    if args.append is not None:
        with args.append.open("a", encoding="utf-8") as out:
            out.write("\n" + text)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.merge:
        _write(merged(args.merge), args)
        return 0
    variants = variant_envs(args.variant)
    missing = [s for s in args.servers if s.startswith("inferflux-") and s not in variants]
    if missing:
        raise SystemExit(f"no --variant for {', '.join(missing)}")
    tools, tool_info = _tools(args.servers)
    result: dict[str, Any] = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "command": "bench/compare_servers.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": _machine(),
            "toolchain": tool_info,
            "plan": {
                k: v for k, v in vars(args).items() if k not in ("json", "markdown", "append")
            },
        },
        "models": {},
    }
    for key in args.models:
        model = load_model(key)
        print(f"== {key}: {model.path}", flush=True)
        rows = run_model(model, tools, args)
        result["models"][key] = {"model": _model_meta(model), "rows": rows}
    result["meta"]["machine"]["loadavg_end"] = os.getloadavg()
    _write(result, args)
    errors = sum(r["num_errors"] for m in result["models"].values() for r in m["rows"])
    return 1 if errors else 0
