"""`inferflux --version` and `inferctl --version` print the package version."""

from __future__ import annotations

from importlib import metadata

import pytest
from typer.testing import CliRunner

import inferflux
from inferflux.cli.inferctl.app import app as inferctl_app
from inferflux.cli.serve import app as serve_app


@pytest.mark.parametrize("cli", [serve_app, inferctl_app], ids=["inferflux", "inferctl"])
def test_version_flag_prints_the_version_and_exits_0(cli) -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == inferflux.__version__


def test_the_version_has_one_source() -> None:
    """pyproject.toml reads it from `inferflux.__version__` (setuptools' `dynamic`)."""
    assert metadata.version("inferflux") == inferflux.__version__
