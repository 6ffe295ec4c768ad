"""Without the code `make proto` generates, the HTTP API still builds (no gRPC routes) and
`server.grpc_port` is a ConfigError that says what to run."""

from __future__ import annotations

import sys

import pytest

from inferflux.api import app as app_module


def _without_generated_code(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.startswith("inferflux.api.grpc")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "inferflux.api.grpc.gen", None)  # import fails


def test_the_http_api_builds_without_the_generated_code(monkeypatch: pytest.MonkeyPatch):
    assert len(app_module._grpc_routers()) == 2
    _without_generated_code(monkeypatch)
    assert app_module._grpc_routers() == ()
