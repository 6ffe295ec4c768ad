"""`server.ollama_port`: the second listening socket of `inferflux serve`, its flag, its
validation and its banner line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import uvicorn
from fastapi import FastAPI

from inferflux.cli.serve import _listen_sockets, startup_banner
from inferflux.config.loader import load_settings
from inferflux.config.settings import Settings
from tests.fakes.engine import fake_model_info


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_no_ollama_port_lets_uvicorn_bind() -> None:
    config = uvicorn.Config(FastAPI(), host="127.0.0.1", port=_free_port(), log_config=None)
    assert _listen_sockets(config, None) is None


def test_ollama_port_binds_both_ports_on_the_host() -> None:
    main_port, ollama_port = _free_port(), _free_port()
    config = uvicorn.Config(FastAPI(), host="127.0.0.1", port=main_port, log_config=None)
    sockets = _listen_sockets(config, ollama_port)
    assert sockets is not None
    try:
        assert [s.getsockname() for s in sockets] == [
            ("127.0.0.1", main_port),
            ("127.0.0.1", ollama_port),
        ]
    finally:
        for sock in sockets:
            sock.close()


def test_env_alias_and_equal_ports_refused() -> None:
    settings = load_settings(env={"INFERFLUX_OLLAMA_PORT": "11434"})
    assert settings.server.ollama_port == 11434
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERFLUX_")}
    result = subprocess.run(
        [sys.executable, "-m", "inferflux", "serve", "--port", "9000", "--ollama-port", "9000"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert result.returncode == 2 and "ollama_port" in result.stderr


def test_banner_names_the_ollama_port() -> None:
    settings = Settings.model_validate({"server": {"ollama_port": 11434}})
    assert "OLLAMA_HOST=http://127.0.0.1:11434" in startup_banner(settings, fake_model_info())
    assert "OLLAMA_HOST" not in startup_banner(Settings(), fake_model_info())
