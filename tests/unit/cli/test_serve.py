"""`inferflux serve`: exit codes for bad configuration and models, and the startup banner."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from inferflux.cli.serve import startup_banner
from inferflux.config.settings import Settings
from tests.fakes.engine import fake_model_info


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERFLUX_")}
    return subprocess.run(
        [sys.executable, "-m", "inferflux", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_invalid_config_exits_2_naming_the_key() -> None:
    result = run_cli("serve", "--port", "70000")
    assert result.returncode == 2
    assert "server.port" in result.stderr and "Traceback" not in result.stderr


def test_missing_model_exits_1() -> None:
    result = run_cli("serve", "--model", "/nonexistent/model.gguf", "--port", "18999")
    assert result.returncode == 1
    assert "/nonexistent/model.gguf" in result.stderr and "Traceback" not in result.stderr


def test_help_lists_the_flags() -> None:
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    for flag in ("--host", "--port", "--model", "--model-id", "--config", "--workers"):
        assert flag in result.stdout
    assert "--in-process" in result.stdout


def test_banner_has_url_and_a_pasteable_curl() -> None:
    settings = Settings.model_validate({"server": {"host": "0.0.0.0", "port": 9001}})
    banner = startup_banner(settings, fake_model_info())
    assert "http://127.0.0.1:9001" in banner
    curl_line = next(line.strip() for line in banner.splitlines() if "curl" in line)
    argv = shlex.split(curl_line)
    assert argv[:3] == ["curl", "-s", "http://127.0.0.1:9001/v1/chat/completions"]
    assert '"model": "fake-model"' in argv[-1]
