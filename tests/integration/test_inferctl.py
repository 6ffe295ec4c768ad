"""inferctl against the real server: status, models, completion and chat, and its exit codes.

The interactive chat in a pseudo-terminal: test_inferctl_repl.py; pull: test_inferctl_pull.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferflux.cli.inferctl import app
from tests.integration.server_process import free_port

pytestmark = [pytest.mark.model, pytest.mark.server]

runner = CliRunner()


def test_status_reports_a_ready_worker(server_url: str) -> None:
    result = runner.invoke(app, ["status", "--url", server_url])
    assert result.exit_code == 0, result.output
    assert "ready: True" in result.output
    assert "worker 0" in result.output
    assert "backend cpu" in result.output and "requested" not in result.output  # no fallback


def test_status_takes_host_and_port(server_url: str) -> None:
    host, port = server_url.removeprefix("http://").split(":")
    result = runner.invoke(app, ["status", "--host", host, "--port", port])
    assert result.exit_code == 0, result.output
    assert "running 0 waiting 0" in result.output


def test_status_json_has_the_workers(server_url: str) -> None:
    result = runner.invoke(app, ["status", "--url", server_url, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["workers"][0]["ready"] is True


def test_models_lists_the_served_model(server_url: str) -> None:
    result = runner.invoke(app, ["models", "list", "--url", server_url, "--json"])
    assert result.exit_code == 0
    model_id = json.loads(result.output)["data"][0]["id"]
    plain = runner.invoke(app, ["models", "list", "--url", server_url])
    assert plain.exit_code == 0
    assert plain.output.split() == [model_id]


def test_completion_streams_text(server_url: str) -> None:
    args = ["completion", "--url", server_url, "--prompt", "Once upon a time", "--max-tokens", "8"]
    result = runner.invoke(app, [*args, "--stream", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.strip()


def test_chat_json_reply_has_the_assistant_message(server_url: str) -> None:
    args = ["chat", "--url", server_url, "--message", "user:Say hi", "--max-tokens", "8", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    reply = json.loads(result.output)
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["completion_tokens"] >= 1


def test_chat_streams_with_a_system_message(server_url: str) -> None:
    args = ["chat", "--url", server_url, "--system", "Be brief.", "--message", "user:Hi"]
    result = runner.invoke(app, [*args, "--max-tokens", "8", "--stream", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.strip()


def test_interactive_chat_reads_piped_lines(server_url: str) -> None:
    args = ["chat", "--interactive", "--url", server_url, "--max-tokens", "8"]
    result = runner.invoke(app, args, input="Say hi\n/model\n/reset\nSay hi again\n")
    assert result.exit_code == 0, result.output
    assert result.output.count("tokens/s]") == 2
    assert "(history cleared)" in result.output


def test_api_errors_exit_1_with_the_envelope_message(server_url: str) -> None:
    args = ["completion", "--url", server_url, "--prompt", "Hi", "--model", "no-such-model"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "404" in result.output and "no-such-model" in result.output


def test_a_bad_message_is_a_usage_error() -> None:
    result = runner.invoke(app, ["chat", "--message", "Hello without a role"])
    assert result.exit_code == 2


def test_chat_needs_a_message_or_interactive() -> None:
    assert runner.invoke(app, ["chat"]).exit_code == 2


def test_url_and_host_together_are_a_usage_error() -> None:
    result = runner.invoke(app, ["status", "--url", "127.0.0.1:1", "--host", "127.0.0.1"])
    assert result.exit_code == 2


def test_an_unreachable_server_exits_1_without_a_traceback() -> None:
    inferctl = str(Path(sys.executable).with_name("inferctl"))
    done = subprocess.run(
        [inferctl, "status", "--url", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert done.returncode == 1
    assert "cannot reach" in done.stderr
    assert "Traceback" not in done.stderr
