"""Test-side parts for the security integration tests: a policy source the test can
change, a middleware that acts as a given key/tenant (authentication is part A's, not in
this branch), a real redis-server on a free port, and a loopback OPA Data API endpoint
that evaluates a real Rego policy with regorus (the `opa-eval` package)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import opa_eval
import redis

from inferflux.security.context import context_of
from inferflux.security.policy import Policy
from inferflux.security.principal import ALL_SCOPES, Principal
from tests.integration.server_process import free_port

PRINCIPAL_HEADER = b"x-test-principal"


class MutablePolicySource:
    """A `PolicySource` whose policy a test replaces (as the admin API will)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.base = policy

    def current(self) -> Policy:
        return self.policy

    def set(self, **changes: object) -> None:
        self.policy = replace(self.base, **changes)  # type: ignore[arg-type]

    def reset(self) -> None:
        self.policy = self.base


class ActAsMiddleware:
    """Test only: `x-test-principal: <key id>@<tenant>` makes the request run as that API
    key (every scope). Stands where part A's authentication will."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        value = dict(scope["headers"]).get(PRINCIPAL_HEADER)
        if value is None:
            await self.app(scope, receive, send)
            return
        subject, _, tenant = value.decode().partition("@")
        principal = Principal(subject, "api_key", tenant or "default", ALL_SCOPES)
        context_of(scope).principal = principal
        await self.app(scope, receive, send)


class RedisServer:
    """`redis-server` on a free loopback port (or `port`: a restart after `kill()`), no
    persistence; `kill()` for outages (SIGKILL)."""

    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run `make setup`")
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.mkdtemp(prefix="inferflux-redis-")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir,
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with redis.Redis(port=self.port, socket_timeout=0.5) as client:
                    if client.ping():
                        return
            except redis.RedisError:
                time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


REGO_POLICY = """
package inferflux

import rego.v1

default decision := {"allow": false, "reason": "tenant not allowed"}

decision := {"allow": true} if {
    input.principal.tenant != "blocked"
    input.prompt.num_chars < 20000
    not contains(lower(object.get(input.prompt, "text", "")), "forbidden topic")
}
"""


class OpaServer:
    """A loopback HTTP server answering OPA's Data API (`POST /v1/data/inferflux/decision`
    → `{"result": ...}`) by evaluating `REGO_POLICY` with regorus. Not the OPA binary (it
    cannot be installed here), but a real Rego evaluation in OPA's wire format.
    `/v1/data/broken` answers `{}` (an undefined decision); `inputs` keeps every input."""

    def __init__(self, policy: str = REGO_POLICY) -> None:
        self._policy_dir = tempfile.mkdtemp(prefix="inferflux-opa-")
        path = Path(self._policy_dir) / "policy.rego"
        path.write_text(policy, encoding="utf-8")
        evaluator = opa_eval.OpaEval(str(path), query="data.inferflux.decision")
        inputs: list[dict] = []
        self.inputs = inputs

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                inputs.append(body["input"])
                if self.path.split("?")[0] == "/v1/data/inferflux/decision":
                    answer = {"result": evaluator.evaluate_parsed(json.dumps(body["input"]))}
                else:
                    answer = {}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self._policy_dir, ignore_errors=True)
