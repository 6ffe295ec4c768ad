"""`inferctl status` and `inferctl admin workers` text in disaggregated mode (pool health,
the KV channel, each worker's role), and `--role` without `--set`. Against a real server:
tests/integration/test_inferctl.py."""

from __future__ import annotations

from typer.testing import CliRunner

from inferflux.cli.inferctl.admin_workers import _model_lines
from inferflux.cli.inferctl.app import app, status_lines

WORKER = {"pid": 7, "ready": True, "restarts": 0, "num_in_flight": 0, "hangs": 0}
STATS = {"ready": True, "model": {"id": "m"}, "uptime_s": 1.5}


def test_unified_status_is_unchanged() -> None:
    stats = {**STATS, "pools": None, "channel": None, "workers": [{**WORKER, "worker_id": 0}]}
    lines = status_lines(stats)
    assert lines[0] == "ready: True  model: m  uptime: 1.5s"
    assert len(lines) == 2 and "role" not in lines[1]


def test_disaggregated_status_shows_pool_health_and_the_channel() -> None:
    pool = {"size": 1, "ready": 0, "queue_depth": 3, "num_running": 0, "num_in_flight": 0}
    decode = {"size": 2, "ready": 2, "queue_depth": 1, "num_running": 2, "num_in_flight": 4}
    channel = {"capacity": 8, "in_flight": 2, "in_flight_bytes": 3 << 20, "prefill_queue": 3,
               "handed_off": 10, "blocked": 1, "direct": 2, "resubmitted": 0}  # fmt: skip
    workers = [{**WORKER, "worker_id": 0, "role": "prefill"}, {**WORKER, "worker_id": 1}]
    stats = {**STATS, "pools": {"prefill": pool, "decode": decode}, "channel": channel,
             "workers": workers}  # fmt: skip
    lines = status_lines(stats)
    assert lines[1] == "pool prefill: degraded  ready 0/1  queue 3  running 0  in-flight 0"
    assert lines[2] == "pool decode: ok  ready 2/2  queue 1  running 2  in-flight 4"
    assert lines[3] == (
        "kv channel: in-flight 2/8  3.0 MiB  handed off 10  blocked 1  direct 2  resubmitted 0"
    )
    assert lines[4].endswith("role prefill") and "role" not in lines[5]


def test_a_pool_without_a_ready_decode_worker_is_down() -> None:
    decode = {"size": 1, "ready": 0, "queue_depth": 0, "num_running": 0, "num_in_flight": 0}
    stats = {**STATS, "pools": {"decode": decode}, "channel": None, "workers": []}
    assert "pool decode: DOWN" in status_lines(stats)[1]


def test_admin_workers_lines_show_pools_and_roles() -> None:
    model = {
        "model": "m", "default": True, "num_workers": 3, "num_draining": 0,
        "pools": {"prefill": {"size": 1, "ready": 1}, "decode": {"size": 2, "ready": 1}},
        "workers": [{**WORKER, "worker_id": 0, "role": "prefill"},
                    {**WORKER, "worker_id": 1, "role": "unified"}],
    }  # fmt: skip
    head, first, second = _model_lines(model)
    assert head == "m (default): workers 3  prefill 1/1 ready  decode 1/2 ready"
    assert first.endswith("role prefill") and "role" not in second


def test_role_needs_set_and_a_known_pool() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["admin", "workers", "--role", "prefill", "--url", "127.0.0.1:1"])
    assert result.exit_code == 2 and "--set" in result.output
    result = runner.invoke(app, ["admin", "workers", "--set", "2", "--role", "gpu"])
    assert result.exit_code == 2
