"""`inferctl` target resolution: --url, --host/--port, INFERCTL_HOST, the default."""

from __future__ import annotations

import pytest
import typer

from inferflux.cli.inferctl.client import base_url


def test_base_url_from_url_host_port_or_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERCTL_HOST", raising=False)
    assert base_url() == "http://127.0.0.1:8080"
    assert base_url("https://h:1") == "https://h:1"
    assert base_url(host="10.0.0.1") == "http://10.0.0.1:8080"
    assert base_url(port=9000) == "http://127.0.0.1:9000"
    monkeypatch.setenv("INFERCTL_HOST", "h:2")
    assert base_url() == "http://h:2"
    assert base_url(host="x", port=3) == "http://x:3"


def test_url_with_host_is_a_usage_error() -> None:
    with pytest.raises(typer.BadParameter):
        base_url("h:1", host="x")
