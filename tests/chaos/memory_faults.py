"""Memory faults (REQ-9.3, REQ-9.5) against a real server under 16 streams.

- KV scarce: a small shared llama.cpp KV buffer (`runtime.kv_unified`, `kv_cache_sizing:
  tokens`, a 256-token context, 4 running sequences) that 16 streams cannot fit at once,
  and one stream whose requests cannot fit even alone. The scheduler admits what fits
  and queues the rest: the others all complete, the oversized ones fail cleanly (400
  context_length_exceeded, or 503 kv_cache_full from a step), nothing is lost, no 500.
  `inferflux_decode_failures_total` (a llama_decode without KV room, which the engine
  retries after evicting and splitting: engine/core.py) is reported; the scheduler's
  cell accounting normally keeps it at 0 on a real server, so the engine's
  evict/bisect path itself is covered by tests/integration/test_engine_resilience.py.
- Host memory low: `scheduler.memory_low_mb` set 1 GB above what the host has available,
  so pressure mode is on from the start: every request still succeeds, at most half of
  `max_num_seqs` run at once, `inferflux_memory_pressure` is 1; then the mark is lowered
  live (PATCH /v1/admin/config) and the pressure ends, admissions back to full.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.chaos.context import ChaosRun
from tests.chaos.load import LoadSpec, StreamLoad, tally
from tests.chaos.report import FaultResult, run_faults
from tests.chaos.servers import START_TIMEOUT_S, metric, wait_until
from tests.integration.server_process import ServerProcess

ADMIN_KEY = "sk-chaos-memory-admin-0123456789"
HEADERS = {"authorization": f"Bearer {ADMIN_KEY}"}
MAX_NUM_SEQS = 16
_TEXT = (
    "The committee met on a rainy Tuesday to discuss the budget for the new library, the "
    "repairs to the old bridge, and the schedule of the summer festival in the park. "
)
KV_ENV = {
    "INFERFLUX_MODEL__CTX_SIZE": "256",
    "INFERFLUX_RUNTIME__KV_UNIFIED": "true",
    "INFERFLUX_RUNTIME__KV_CACHE_SIZING": "tokens",
    "INFERFLUX_SCHEDULER__MAX_NUM_SEQS": "4",
    "INFERFLUX_SCHEDULER__PREFIX_CACHE__MAX_TOKENS": "256",
    # queued requests wait for KV instead of timing out on a slow (shared) CPU
    "INFERFLUX_SCHEDULER__QUEUE_TIMEOUT_S": "300",
}


def stats(url: str) -> dict[str, Any]:
    """/server/stats with the admin key (the server has keys: it asks for one)."""
    return dict(httpx.get(f"{url}/server/stats", headers=HEADERS, timeout=10).json())


def _workers_ready(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError, KeyError):
        return all(w["ready"] for w in stats(url)["workers"])
    return False


@contextlib.contextmanager
def _serving(run: ChaosRun, name: str, env: dict[str, str]) -> Iterator[ServerProcess]:
    """A server with an admin key (memory-inferflux.yaml) and `env`, its worker ready."""
    config = run.log_dir / "memory-inferflux.yaml"
    keys = {"auth": {"api_keys": [{"key": ADMIN_KEY, "id": "ops", "roles": ["admin"]}]}}
    config.write_text(yaml.safe_dump(keys), encoding="utf-8")
    server = ServerProcess("--config", str(config), env=env, log_path=run.log_dir / name)
    try:
        server.wait_ready(START_TIMEOUT_S)
        if wait_until(lambda: _workers_ready(server.url), 120) is None:
            raise TimeoutError(f"worker not ready; see {run.log_dir / name}")
        yield server
    finally:
        server.close()


class _Sampler:
    """Reads /server/stats every 0.2 s while `load` runs; keeps the largest values."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.max_running = 0
        self.max_waiting = 0
        self.max_cells_used = 0
        self.cells_total = 0
        self.pressure_seen = False

    def sample(self) -> None:
        now = stats(self.url)
        self.max_running = max(self.max_running, now["num_running"])
        self.max_waiting = max(self.max_waiting, now["queue_depth"])
        self.max_cells_used = max(self.max_cells_used, now["kv_cells_used"])
        self.cells_total = now["kv_cells_total"]
        self.pressure_seen |= any(w.get("memory_pressure") for w in now["workers"])

    def during(self, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not until():
            self.sample()
            time.sleep(0.2)


def kv_scarce(run: ChaosRun) -> FaultResult:
    result = FaultResult(
        "KV cache scarce: 16 streams over a 4-sequence shared KV, 1 stream oversized",
        target="0 lost, 0 500s; every request that fits completes; an oversized one fails "
        "cleanly (400 context_length_exceeded / 503 kv_cache_full); KV never overcommitted",
        passed=True,
    )
    fits = LoadSpec(
        streams=run.streams - 1,
        max_tokens=16,
        headers=HEADERS,
        body={"messages": [{"role": "user", "content": _TEXT * 4}]},
    )
    too_big = LoadSpec(
        streams=1,
        max_tokens=16,
        headers=HEADERS,
        body={"messages": [{"role": "user", "content": _TEXT * 12}]},
        pause_after_failure_s=0.5,
    )
    with _serving(run, "memory-kv.log", KV_ENV) as server:
        failures_before = metric(server.url, "inferflux_decode_failures_total", HEADERS)
        sampler = _Sampler(server.url)
        loads = [StreamLoad(server.url, fits).start(), StreamLoad(server.url, too_big).start()]
        sampler.during(run.seconds(30))
        ok_counts, big_counts = (tally(load.stop()) for load in loads)
        big = loads[1].outcomes
        failures = metric(server.url, "inferflux_decode_failures_total", HEADERS) - failures_before
    for counts in (ok_counts, big_counts):
        result.count(counts)
    codes = sorted({o.detail[:60] for o in big if o.kind != "ok"})
    result.notes.append(
        f"fitting: {ok_counts.ok} ok of {ok_counts.sent}; oversized: {big_counts.failed} "
        f"failed cleanly of {big_counts.sent}; most running {sampler.max_running}, most "
        f"queued {sampler.max_waiting}; KV cells used at most {sampler.max_cells_used} of "
        f"{sampler.cells_total}; decode failures (KV full in a step): +{failures:.0f}"
    )
    clean = all(
        (o.status == 400 and "maximum context length" in o.detail)
        or (o.status == 503 and "kv_cache_full" in o.detail)
        for o in big
        if o.kind == "failed"
    )
    result.check(result.lost == 0 and result.status_500 == 0, "0 lost and 0 500s")
    result.check(ok_counts.ok == ok_counts.sent > 0, "every fitting request completes")
    result.check(big_counts.sent > 0 and big_counts.ok == 0 and clean, f"oversized: {codes}")
    result.check(sampler.max_waiting > 0, "the KV was scarce (requests queued)")
    result.check(sampler.max_cells_used <= sampler.cells_total, "KV never overcommitted")
    return result


def _mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _pressure(url: str) -> float:
    return metric(url, "inferflux_memory_pressure", HEADERS)


def _set_low_mark(url: str, mb: int) -> int:
    change = {"scheduler": {"memory_low_mb": mb}}
    return httpx.patch(
        f"{url}/v1/admin/config", json=change, headers=HEADERS, timeout=10
    ).status_code


def memory_low(run: ChaosRun) -> FaultResult:
    result = FaultResult(
        "host memory low (memory_low_mb 1 GB above MemAvailable), 16 streams",
        target="0 failed, 0 lost; pressure on, ≤ half of max_num_seqs running; lowered "
        "live → pressure off ≤ 30 s, admissions back to full",
        passed=True,
    )
    low_mb = _mem_available_mb() + 1024
    env = {
        "INFERFLUX_SCHEDULER__MEMORY_LOW_MB": str(low_mb),
        "INFERFLUX_SCHEDULER__MAX_NUM_SEQS": str(MAX_NUM_SEQS),
    }
    spec = LoadSpec(streams=run.streams, max_tokens=32, headers=HEADERS)
    with _serving(run, "memory-low.log", env) as server:
        under = _Sampler(server.url)
        load = StreamLoad(server.url, spec).start()
        under.during(run.seconds(20))
        gauge = _pressure(server.url)
        episodes = metric(server.url, "inferflux_memory_pressure_episodes_total", HEADERS)
        status = _set_low_mark(server.url, 0)
        ended = wait_until(lambda: _pressure(server.url) == 0, 30)
        after = _Sampler(server.url)
        after.during(run.seconds(20))
        counts = tally(load.stop())
    result.count(counts)
    result.recovery_s = ended  # from the PATCH's answer until the gauge read 0
    result.notes.append(
        f"low mark {low_mb} MB; inferflux_memory_pressure {gauge:.0f}, episodes "
        f"{episodes:.0f}; most running {under.max_running} under pressure, "
        f"{after.max_running} after (max_num_seqs {MAX_NUM_SEQS}); PATCH {status}"
    )
    result.check(counts.ok == counts.sent > 0, "every request ok")
    result.check(gauge == 1 and episodes >= 1 and under.pressure_seen, "pressure on")
    result.check(0 < under.max_running <= MAX_NUM_SEQS // 2, "admissions halved")
    result.check(status == 200 and ended is not None, "pressure ends when lowered live")
    result.check(after.max_running > MAX_NUM_SEQS // 2, "admissions back to full")
    return result


def memory_faults(run: ChaosRun) -> list[FaultResult]:
    return run_faults(run, (kv_scarce, memory_low))
