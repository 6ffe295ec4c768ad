"""The OPA endpoint slow, failing and unreachable under load: the server fails closed (the
default, guardrails.opa_fail_open false) with 503 policy_unavailable, each refusal takes no
longer than guardrails.opa_timeout_s (plus the request's own overhead), and requests pass
again as soon as OPA answers."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, Outcome, StreamLoad, between, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import serving

OPA_TIMEOUT_S = 0.5
SLOW_S = 3.0  # far past the timeout
MARGIN_S = 2.0
BOUND_S = OPA_TIMEOUT_S + 1.5  # a refusal's latency bound on a loaded 2-core machine


class ControlledOpa:
    """A loopback OPA Data API whose `mode` the fault sets: `ok` (allow), `slow` (answers
    after SLOW_S), `fail` (HTTP 500); `stop()` / `restart()` make it unreachable and back
    (same port)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self.restart()
        self.url = f"http://127.0.0.1:{self.port}/v1/data/inferflux/allow"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        opa = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", "0")))
                if opa.mode == "slow":
                    time.sleep(SLOW_S)
                status, data = (500, b"boom") if opa.mode == "fail" else (200, b"")
                data = data or json.dumps({"result": True}).encode()
                with contextlib.suppress(OSError):  # the client gave up (its timeout)
                    self.send_response(status)
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def restart(self) -> None:
        handler = self._handler()
        server = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 256})
        self._server = server(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _latency_p99(outcomes: list[Outcome]) -> float:
    times = sorted(o.ended_at - o.sent_at for o in outcomes)
    return times[int(0.99 * (len(times) - 1))] if times else 0.0


def _phase(result: FaultResult, outcomes: list[Outcome], mark: tuple[float, float, float]) -> None:
    """`mark`: (fault at, fault ended at, next fault at). Every request sent during the
    fault is refused, and every one sent after it ended passes, less those sent within
    MARGIN_S of a switch (a loaded server may ask OPA that much later)."""
    fault_at, end_at, next_at = mark
    result.count(tally([o for o in outcomes if between(fault_at, next_at)(o)]))
    during = [o for o in outcomes if between(fault_at, end_at - MARGIN_S)(o)]
    refused = [o for o in during if o.kind == "failed"]
    after = [o for o in outcomes if between(end_at + MARGIN_S, next_at - MARGIN_S)(o)]
    first_ok = [o.ended_at for o in outcomes if o.sent_at >= end_at and o.kind == "ok"]
    result.recovery_s = min(first_ok) - end_at if first_ok else None
    p99 = _latency_p99(refused)
    codes = sorted({o.detail[:8] for o in refused})
    result.notes.append(
        f"{len(refused)} of {len(during)} sent during the fault refused ({codes}); refusal "
        f"latency p99 {p99:.2f} s (guardrails.opa_timeout_s {OPA_TIMEOUT_S} s); "
        f"{sum(o.kind == 'ok' for o in after)} of {len(after)} ok after"
    )
    result.notes += [
        f"after: {o.kind} {o.detail[:80]} sent {o.sent_at - end_at:.1f} s after the fault ended"
        for o in after
        if o.kind != "ok"
    ][:3]
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    result.check(len(refused) == len(during) and bool(during), "every request refused")
    result.check(all(o.status == 503 for o in refused), "refused with 503")
    result.check(p99 <= BOUND_S, f"refusal latency p99 ≤ {BOUND_S} s")
    result.check(all(o.kind == "ok" for o in after), "requests pass again after OPA is back")


def _sleep_until_sent(load: StreamLoad, since: float, num: int, min_s: float) -> None:
    """At least `min_s`, and until `num` requests sent after `since` ended (≤ 120 s)."""
    time.sleep(min_s)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sum(o.sent_at >= since for o in list(load.outcomes)) >= num:
            return
        time.sleep(0.2)


def _inject(opa: ControlledOpa, mode: str, load: StreamLoad, phase_s: float) -> tuple[float, float]:
    fault_at = time.monotonic()
    if mode == "unreachable":
        opa.stop()
    else:
        opa.mode = mode
    _sleep_until_sent(load, fault_at + 1, 32, phase_s)
    end_at = time.monotonic()
    if mode == "unreachable":
        opa.restart()
    else:
        opa.mode = "ok"
    return fault_at, end_at


MODES = ("slow", "fail", "unreachable")


def opa_faults(run: ChaosRun) -> list[FaultResult]:
    opa = ControlledOpa()
    env = {
        "INFERFLUX_GUARDRAILS__OPA_ENDPOINT": opa.url,
        "INFERFLUX_GUARDRAILS__OPA_TIMEOUT_S": str(OPA_TIMEOUT_S),
    }
    phase_s = max(8.0, run.seconds(12))  # room for the margins around each switch
    windows: list[tuple[float, float]] = []
    try:
        with serving(run.log_dir, "opa", env=env) as server:
            spec = LoadSpec(streams=run.streams, max_tokens=1, pause_after_failure_s=0.2)
            load = StreamLoad(server.url, spec).start()
            load.wait_for(run.streams)
            for mode in MODES:
                windows.append(_inject(opa, mode, load, phase_s))
                _sleep_until_sent(load, time.monotonic() + 1, 16, phase_s)
            outcomes = load.stop()
            ended_at = time.monotonic()
    finally:
        opa.stop()
    results = []
    nexts = [w[0] for w in windows[1:]] + [ended_at]
    for mode, (fault_at, end_at), next_at in zip(MODES, windows, nexts, strict=True):
        result = FaultResult(
            f"OPA {mode} ({run.streams} streams, fail closed)",
            target=f"every request 503 while OPA is {mode}, latency p99 ≤ {BOUND_S} s; "
            "0 lost, 0 500s; all pass again after",
            passed=True,
            duration_s=next_at - fault_at,
        )
        _phase(result, outcomes, (fault_at, end_at, next_at))
        results.append(result)
    calm = tally([o for o in outcomes if o.sent_at < windows[0][0]])
    results[0].notes.append(f"before the faults: {calm.ok} ok of {calm.sent}")
    return results
