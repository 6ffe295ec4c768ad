"""The disk full under the audit log, the policy store and the server's log file, then the
policy store's filesystem read-only (small tmpfs mounts made here; needs root): admin
writes fail cleanly (503 policy_unavailable, the change not applied), inference keeps
going (audit and log lines that cannot be written are dropped, as docs/reliability.md
says; dropped audit lines are counted in inferflux_audit_lines_dropped_total), admin
writes succeed again once space returns, and a restart reads the store intact. The audit
log and the log file are not made read-only: Linux refuses to remount a filesystem
read-only while a file on it is open for writing, which theirs always are. The KV spill
folder's faults are kv_disk_faults.py's (run at the end of this group)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from tests.chaos.context import ChaosRun
from tests.chaos.kv_disk_faults import fill_until_full, kv_disk_faults
from tests.chaos.load import LoadSpec, StreamLoad, tally
from tests.chaos.report import FaultResult
from tests.chaos.servers import metric, wait_until
from tests.integration.server_process import ServerProcess

ADMIN_KEY = "sk-chaos-admin-0123456789abcdef"
PASSPHRASE = "chaos suite policy store passphrase"
SIZE = "16m"
AUDIT_DROPPED = "inferflux_audit_lines_dropped_total"


@contextlib.contextmanager
def _tmpfs() -> Iterator[Path]:
    """A SIZE tmpfs on a fresh folder, unmounted on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="inferflux-chaos-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _fill(folder: Path) -> Path:
    """Write zeros into `folder/filler` until the filesystem is full."""
    filler = folder / "filler"
    fill_until_full(filler)
    return filler


def _create_key(url: str, name: str) -> int:
    body = {"name": name, "scopes": ["generate", "read"]}
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.post(
        f"{url}/v1/admin/api_keys", json=body, headers=headers, timeout=10
    ).status_code


def _key_names(url: str) -> set[str]:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    data = httpx.get(f"{url}/v1/admin/api_keys", headers=headers, timeout=10).json()["data"]
    return {str(k.get("name")) for k in data}


def _start(folder: Path, store: Path, config: Path, log_dir: Path) -> ServerProcess:
    env = {
        "INFERFLUX_POLICY_STORE": str(store / "policy.store"),
        "INFERFLUX_POLICY_PASSPHRASE": PASSPHRASE,
        "INFERFLUX_AUDIT__PATH": str(folder / "audit.jsonl"),
    }
    log_path = folder / "server.log"
    server = ServerProcess("--config", str(config), env=env, log_path=log_path)
    try:
        server.wait_ready(240)
    except (RuntimeError, TimeoutError):
        server.kill()
        shutil.copy(folder / "server.log", log_dir / "disk-server.log")
        raise
    return server


def _phase(
    result: FaultResult,
    url: str,
    folder: Path,
    streams: int,
    phase_s: float,
    name: str,
    *,
    audit_full: bool = False,
) -> None:
    """Under the fault: load keeps going, an admin write gets 503 and is not applied."""
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    spec = LoadSpec(streams=streams, max_tokens=8, headers=headers)
    load = StreamLoad(url, spec).start()
    audit_before = (folder / "audit.jsonl").stat().st_size
    dropped_before = metric(url, AUDIT_DROPPED, headers)
    time.sleep(phase_s / 2)
    status = _create_key(url, name)
    applied = name in _key_names(url)
    time.sleep(phase_s / 2)
    counts = tally(load.stop())
    result.count(counts)
    audit_grew = (folder / "audit.jsonl").stat().st_size - audit_before
    dropped = metric(url, AUDIT_DROPPED, headers) - dropped_before
    result.notes.append(
        f"admin write {status} (applied: {applied}); load {counts.ok} ok of {counts.sent}; "
        f"audit file grew {audit_grew} bytes; {AUDIT_DROPPED}: +{dropped:.0f}"
    )
    if audit_full:
        result.check(dropped > 0, "dropped audit lines counted")
    result.check(status == 503 and not applied, "admin write 503 and not applied")
    result.check(counts.ok == counts.sent and counts.sent > 0, "inference kept going")


def _recover(result: FaultResult, url: str, name: str, since: float) -> None:
    took = wait_until(lambda: _create_key(url, name) == 201, 30)
    result.recovery_s = None if took is None else time.monotonic() - since
    result.check(took is not None, "admin writes succeed again")


def disk_faults(run: ChaosRun) -> list[FaultResult]:
    full = FaultResult(
        "disk full: audit log, policy store, log file (16 streams)",
        target="admin write 503 + not applied; inference unaffected; writes again ≤ 30 s "
        "after space returns; store intact on restart",
        passed=True,
    )
    readonly = FaultResult(
        "disk read-only: policy store (16 streams)",
        target="admin write 503 + not applied; inference unaffected; writes again after "
        "remount rw; store intact on restart",
        passed=True,
    )
    config = run.log_dir / "disk-inferflux.yaml"
    keys = {"auth": {"api_keys": [{"key": ADMIN_KEY, "id": "ops", "roles": ["admin"]}]}}
    config.write_text(yaml.safe_dump(keys), encoding="utf-8")
    phase_s = run.seconds(12)
    with _tmpfs() as folder, _tmpfs() as store:
        server = _start(folder, store, config, run.log_dir)
        try:
            assert _create_key(server.url, "before") == 201
            started = time.monotonic()
            fillers = [_fill(folder), _fill(store)]
            _phase(full, server.url, folder, run.streams, phase_s, "during-full", audit_full=True)
            for filler in fillers:
                filler.unlink()
            _recover(full, server.url, "after-full", time.monotonic())
            full.duration_s = time.monotonic() - started
            started = time.monotonic()
            subprocess.run(["mount", "-o", "remount,ro", str(store)], check=True)
            _phase(readonly, server.url, folder, run.streams, phase_s, "during-ro")
            subprocess.run(["mount", "-o", "remount,rw", str(store)], check=True)
            _recover(readonly, server.url, "after-ro", time.monotonic())
            readonly.duration_s = time.monotonic() - started
        finally:
            server.close()
            shutil.copy(folder / "server.log", run.log_dir / "disk-server.log")
        restarted = _start(folder, store, config, run.log_dir)
        try:
            names = _key_names(restarted.url)
        finally:
            restarted.close()
    want = {"before", "after-full", "after-ro"}
    for result in (full, readonly):
        result.notes.append(f"keys after a restart: {sorted(names - {'None', ''})}")
        result.check(want <= names and not names & {"during-full", "during-ro"}, "store intact")
    log = (run.log_dir / "disk-server.log").read_text(errors="replace")
    full.notes.append(f"server log: {log.count('Logging error')} 'Logging error' reports")
    return [full, readonly, *kv_disk_faults(run)]
