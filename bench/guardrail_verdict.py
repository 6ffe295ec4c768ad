"""Guardrail verdict latency (spec: P95 < 500 ms including OPA).

Runs the real input chain (`Guardrails.check_input`: RE2 blocklist, PII scan, and an OPA
decision over HTTP) on prompts of several sizes, with OPA answered by a loopback HTTP
server that evaluates a Rego policy with regorus (`opa-eval`; the OPA binary is not
installable here), and the output scanner per streamed delta. Prints P50/P95/P99.

    .venv/bin/python bench/guardrail_verdict.py [--n 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import opa_eval

from inferflux.config.security_settings import GuardrailSettings
from inferflux.security.digest import TextDigester
from inferflux.security.guardrails import DecisionContext, Guardrails
from inferflux.security.policy import GuardrailPolicy, Policy, StaticPolicySource
from inferflux.security.principal import ANONYMOUS

REGO = """
package inferflux
import rego.v1
default decision := {"allow": false, "reason": "denied"}
decision := {"allow": true} if input.principal.tenant != "blocked"
"""


def opa_server() -> tuple[ThreadingHTTPServer, str]:
    path = Path(tempfile.mkdtemp()) / "policy.rego"
    path.write_text(REGO)
    evaluator = opa_eval.OpaEval(str(path), query="data.inferflux.decision")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["content-length"]))
            result = evaluator.evaluate_parsed(json.dumps(json.loads(body)["input"]))
            data = json.dumps({"result": result}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1/data/inferflux/decision"


def percentiles(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100)
    return f"p50 {q[49] * 1e3:8.3f} ms  p95 {q[94] * 1e3:8.3f} ms  p99 {q[98] * 1e3:8.3f} ms"


async def main(n: int) -> None:
    server, endpoint = opa_server()
    policy = GuardrailPolicy(
        blocklist=("launch codes", "secret plan", "forbidden"),
        blocklist_regex=(r"(?i)pass(word)?\s*[:=]",),
        pii_action="redact",
        opa_endpoint=endpoint,
    )
    async with httpx.AsyncClient() as client:
        guardrails = Guardrails(
            StaticPolicySource(Policy(guardrails=policy)),
            GuardrailSettings(),
            TextDigester(b"k" * 32),
            client,
        )
        context = DecisionContext(ANONYMOUS, "model", "/v1/chat/completions")
        sentence = "Please summarise the quarterly report and mail it to bob@example.com. "
        for num_chars in (200, 2_000, 20_000):
            text = (sentence * (num_chars // len(sentence) + 1))[:num_chars]
            samples = []
            for _ in range(n):
                started = time.perf_counter()
                await guardrails.check_input(text, context)
                samples.append(time.perf_counter() - started)
            print(f"input chain incl. OPA, {num_chars:>6} chars: {percentiles(samples)}")
        scanner_samples = []
        for _ in range(max(1, n // 10)):
            scanner = guardrails.output_scanner()
            assert scanner is not None
            for piece in (sentence * 30).split(" "):
                started = time.perf_counter()
                scanner.feed(piece + " ")
                scanner_samples.append(time.perf_counter() - started)
        print(f"output scan per delta (64-char window):  {percentiles(scanner_samples)}")
    server.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="verdicts per prompt size")
    asyncio.run(main(parser.parse_args().n))
