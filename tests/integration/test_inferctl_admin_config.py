"""`inferctl admin config` against a real server (auth on): the settings as dotted lines
with the live keys marked and secrets masked, `--set` changing live keys (seen in the next
GET), a restart-only key refused with 409 `restart_required`, bad values and malformed
`--set` with their exit codes."""

from __future__ import annotations

import json

import pytest

from tests.integration.inferctl_admin_server import (
    ADMIN_KEY,
    GENERATE_KEY,
    as_json,
    cli,
    ok,
    server,
)

pytestmark = [pytest.mark.model, pytest.mark.server]
__all__ = ["server"]  # the module-scoped fixture


def test_show_marks_live_keys_and_masks_secrets(server):
    shown = ok(server, "config").stdout
    lines = shown.splitlines()
    assert any(line.startswith("scheduler.max_batch_tokens = ") for line in lines)
    assert any(line.startswith("scheduler.max_batch_tokens") and "(live)" in line for line in lines)
    port_line = next(line for line in lines if line.startswith("server.port = "))
    assert "(live)" not in port_line
    assert ADMIN_KEY not in shown and GENERATE_KEY not in shown and '"***"' in shown
    answer = as_json(server, "config")
    assert answer["object"] == "config" and "scheduler.max_batch_tokens" in answer["live"]


def test_set_changes_live_keys_in_one_request(server):
    before = as_json(server, "config")["config"]
    interval = before["scheduler"]["stream_interval"] % 4 + 1
    changed = ok(
        server, "config", "--set", f"scheduler.stream_interval={interval}",
        "--set", "observability.log_level=debug",
    ).stdout  # fmt: skip
    assert changed.splitlines()[0] == (
        "changed: observability.log_level, scheduler.stream_interval"
    )
    after = as_json(server, "config")["config"]
    assert after["scheduler"]["stream_interval"] == interval
    assert after["observability"]["log_level"] == "debug"
    same = json.loads(
        ok(server, "config", "--set", f"scheduler.stream_interval={interval}", "--json").stdout
    )
    assert same["changed"] == []
    ok(server, "config", "--set", f"observability.log_level={before['observability']['log_level']}")


def test_a_restart_only_key_is_refused_with_409(server):
    port = as_json(server, "config")["config"]["server"]["port"]
    refused = cli(server, "config", "--set", f"server.port={port + 1}")
    assert refused.exit_code == 1
    assert "409" in refused.output and "server.port" in refused.output
    assert as_json(server, "config")["config"]["server"]["port"] == port


def test_a_bad_value_is_the_server_error(server):
    refused = cli(server, "config", "--set", "scheduler.stream_interval=-5")
    assert refused.exit_code == 1 and "400" in refused.output
    unknown = cli(server, "config", "--set", "scheduler.no_such_knob=1")
    assert unknown.exit_code == 1 and "no_such_knob" in unknown.output


@pytest.mark.parametrize(
    "sets",
    [
        ["scheduler"],
        ["max_batch_tokens=4"],
        ["scheduler.=4"],
        ["scheduler.stream_interval=2", "scheduler.stream_interval=3"],
        ["scheduler.fairness=1", "scheduler.fairness.enable_preemption=true"],
    ],
)
def test_a_malformed_set_exits_2(server, sets):
    args = [part for item in sets for part in ("--set", item)]
    result = cli(server, "config", *args)
    assert result.exit_code == 2, result.output
    assert "--set" in result.output


def test_without_the_admin_scope_exits_1_with_403(server):
    result = cli(server, "config", key=GENERATE_KEY)
    assert result.exit_code == 1 and "403" in result.output
