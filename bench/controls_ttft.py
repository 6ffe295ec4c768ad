"""What the enterprise controls cost in time to first token: every control on vs all off.

Two fresh servers on the same model, run in alternated order over `--rounds` rounds:

- **off**: `inferflux serve` as `make run` starts it (no keys, no limits, no guardrails,
  no audit file, no tracing);
- **on**: an API key (`auth.api_keys`), per-key rate limits kept in a real redis-server,
  guardrails with a blocklist, PII redaction and an OPA policy (a loopback server
  evaluating real Rego with regorus, as the tests use), the audit log written to a file,
  and OTLP tracing exported to a loopback receiver (a minimal OTLP/HTTP endpoint that
  accepts and drops the spans).

Load: short chat prompts (8–16 words), `--max-tokens` tokens, greedy, streamed, at each
`--concurrency` level. Per setting and level: TTFT p50/p95 (median over rounds), and the
persona KPI check "TTFT < 250 ms P95 on CPU with audit + guardrails enabled".

    .venv/bin/python bench/controls_ttft.py --json bench/results/controls_ttft.json
    .venv/bin/python bench/controls_ttft.py --settings off,keys,limits,guardrails,opa,audit,tracing

The second form turns one control on at a time, to find which one costs what.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from launch import kill_group, model_args, start_server
from serve_load import LoadConfig, make_http_client, resolve_model, run_level, stream_one
from workload import make_prompts, percentile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.security_support import OpaServer, RedisServer  # noqa: E402

_PORT = 18441
_KEY = "bench-controls-key"
_KPI_P95_S = 0.250


class _OtlpSink(BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP trace exports and drops them (an empty ExportTraceServiceResponse)."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


CONTROLS = ("keys", "limits", "guardrails", "opa", "audit", "tracing")


def _controls_config(folder: Path, controls: set[str], redis_url: str, opa_url: str) -> Path:
    """The config file of a server with `controls` on ("limits" needs a key: it adds one)."""
    config: dict[str, Any] = {}
    if controls & {"keys", "limits"}:
        config["auth"] = {"api_keys": [{"key": _KEY, "scopes": ["generate", "read"]}]}
    if "limits" in controls:
        config["rate_limit"] = {
            "requests_per_minute": 100_000,
            "tokens_per_minute": 100_000_000,
            "max_concurrent": 256,
        }
        config["redis"] = {"url": redis_url}
    guardrails: dict[str, Any] = {}
    if "guardrails" in controls:
        guardrails = {
            "blocklist": ["launch codes", "secret project"],
            "blocklist_regex": [r"(?i)pass(word)?\s*[:=]"],
            "pii_action": "redact",
        }
    if "opa" in controls:
        guardrails["opa_endpoint"] = f"{opa_url}/v1/data/inferflux/decision"
    if guardrails:
        config["guardrails"] = guardrails
    if "audit" in controls:
        config["audit"] = {"path": str(folder / "audit.jsonl")}
    path = folder / f"controls-{'-'.join(sorted(controls))}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


async def _measure(config: LoadConfig, levels: list[int], warmup: int) -> list[dict[str, Any]]:
    async with make_http_client(config, max(levels)) as client:
        config = replace(config, model=await resolve_model(client))
        for prompt in make_prompts(warmup, config.seed + 1, 8, 16):
            await stream_one(client, config, prompt)
        out = []
        for concurrency in levels:
            level = await run_level(client, config, concurrency)
            ttfts = [r["ttft_s"] for r in level["requests"] if r["ttft_s"] is not None]
            out.append(
                {
                    "concurrency": concurrency,
                    "errors": level["num_errors"],
                    "ttft_p50_s": percentile(ttfts, 50),
                    "ttft_p95_s": percentile(ttfts, 95),
                    "output_tok_s": level["output_tok_s"],
                }
            )
        return out


def _run(
    setting: str, controls: set[str], args: argparse.Namespace, env: dict[str, str]
) -> list[dict[str, Any]]:
    cli = model_args(args.model)
    if controls:
        cli += ["--config", env.pop("_CONFIG")]
    server = start_server(_PORT, cli, env)
    try:
        config = LoadConfig(
            url=f"http://127.0.0.1:{_PORT}",
            model="",
            endpoint="chat",
            max_tokens=args.max_tokens,
            requests_per_client=args.requests,
            seed=args.seed,
            min_words=8,
            max_words=16,
            api_key=_KEY if controls & {"keys", "limits"} else None,
        )
        levels = asyncio.run(_measure(config, args.concurrency, args.warmup))
    finally:
        kill_group(server)
    for level in levels:
        level["setting"] = setting
        print(
            f"{setting:>10} c={level['concurrency']:<2} TTFT p50 "
            f"{1000 * level['ttft_p50_s']:.0f} ms p95 {1000 * level['ttft_p95_s']:.0f} ms "
            f"errors {level['errors']}",
            flush=True,
        )
    return levels


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting and level: median TTFT p50/p95 over rounds, and p50 minus "off"'s."""
    rows = []
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    for concurrency in sorted({r["concurrency"] for r in runs}):
        at = [r for r in runs if r["concurrency"] == concurrency]
        off = [r["ttft_p50_s"] for r in at if r["setting"] == "off"]
        base = 1000 * statistics.median(off) if off else None
        for setting in settings:
            mine = [r for r in at if r["setting"] == setting]
            p50 = 1000 * statistics.median(r["ttft_p50_s"] for r in mine)
            rows.append(
                {
                    "setting": setting,
                    "concurrency": concurrency,
                    "rounds": len(mine),
                    "errors": sum(r["errors"] for r in mine),
                    "ttft_p50_ms": p50,
                    "ttft_p95_ms": 1000 * statistics.median(r["ttft_p95_s"] for r in mine),
                    "overhead_p50_ms": None if base is None else p50 - base,
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| controls | c | TTFT p50 | TTFT p95 | p50 over off | KPI p95 < 250 ms |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        over = r["overhead_p50_ms"]
        lines.append(
            f"| {r['setting']} | {r['concurrency']} | {r['ttft_p50_ms']:.0f} ms "
            f"| {r['ttft_p95_ms']:.0f} ms | {'-' if over is None else f'{over:+.1f} ms'} "
            f"| {'met' if r['ttft_p95_ms'] < 1000 * _KPI_P95_S else 'missed'} |"
        )
    return "\n".join(lines)


def _controls_of(setting: str) -> set[str]:
    if setting == "off":
        return set()
    if setting == "on":
        return set(CONTROLS)
    if setting not in CONTROLS:
        raise SystemExit(f"unknown setting {setting!r}: off, on, or one of {', '.join(CONTROLS)}")
    return {setting}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="smollm2, gemma, or a GGUF path")
    p.add_argument("--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8])
    p.add_argument("--requests", type=int, default=6, help="requests per client per level")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument(
        "--settings",
        default="off,on",
        help="comma-separated: off, on (every control), or one of " + ", ".join(CONTROLS),
    )
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    redis_server, opa = RedisServer(), OpaServer()
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpSink)
    threading.Thread(target=sink.serve_forever, name="otlp-sink", daemon=True).start()
    env_on = {
        "INFERFLUX_OBSERVABILITY__TRACING__EXPORTER": "otlp",
        "INFERFLUX_OBSERVABILITY__TRACING__OTLP_ENDPOINT": (
            f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
        ),
    }
    names = args.settings.split(",")
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="inferflux-controls-") as folder:
            for round_index in range(args.rounds):
                order = names if round_index % 2 == 0 else list(reversed(names))
                for setting in order:
                    controls = _controls_of(setting)
                    env = dict(env_on) if "tracing" in controls else {}
                    if controls:
                        config = _controls_config(Path(folder), controls, redis_server.url, opa.url)
                        env["_CONFIG"] = str(config)
                    runs += _run(setting, controls, args, env)
    finally:
        sink.shutdown()
        opa.close()
        redis_server.kill()
    rows = summarize(runs)
    print("\n" + markdown(rows))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "runs": runs}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
