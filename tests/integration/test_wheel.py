"""The package as a user installs it: `python -m build` makes an sdist and a wheel; the
wheel, installed into a fresh venv with no source tree in reach, serves a real model.

Slow-ish (about 40 s here: the build, the venv's install with pip's cache, a server):
pip needs PyPI or its cache for the dependencies (llama-cpp-python's compiled wheel
comes from pip's wheel cache, which `make setup` filled).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import inferflux
from tests.integration.server_process import ServerProcess

pytestmark = [pytest.mark.model, pytest.mark.server]

ROOT = Path(__file__).resolve().parents[2]
GEN = "inferflux/api/grpc/gen"
# the installed package only: no PYTHONPATH=src from the test run
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@dataclass
class Built:
    sdist: Path
    wheel: Path


@dataclass
class Installed:
    bin: Path
    home: Path  # an empty working directory: nothing importable from the source tree


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        env=CLEAN_ENV,
        timeout=300,
    )
    (sdist,) = out.glob("inferflux-*.tar.gz")
    (wheel,) = out.glob("inferflux-*.whl")
    return Built(sdist, wheel)


@pytest.fixture(scope="module")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("venv")
    venv.create(root / "venv", with_pip=True)
    bin_dir = root / "venv" / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(built.wheel)],
        check=True,
        capture_output=True,
        env=CLEAN_ENV,
        timeout=600,
    )
    home = root / "home"
    home.mkdir()
    yield Installed(bin_dir, home)


def run(installed: Installed, *command: str) -> str:
    done = subprocess.run(  # noqa: PLW1510 (the exit status is read below)
        [str(installed.bin / command[0]), *command[1:]],
        cwd=installed.home,
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_sdist_carries_the_proto_and_no_generated_code(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert "proto/inferflux/v1/inference.proto" in names
    assert "setup.py" in names
    assert not any(GEN in name for name in names)


def test_the_wheel_carries_the_generated_grpc_code(built: Built) -> None:
    names = set(zipfile.ZipFile(built.wheel).namelist())
    for generated in ("__init__.py", "inference_pb2.py", "inference_pb2.pyi"):
        assert f"{GEN}/{generated}" in names
    assert f"{GEN}/inference_pb2_grpc.py" in names
    grpc_stubs = zipfile.ZipFile(built.wheel).read(f"{GEN}/inference_pb2_grpc.py").decode()
    assert "from . import inference_pb2" in grpc_stubs  # relative, as `make proto` writes it


def test_the_wheel_carries_the_console_files(built: Built) -> None:
    names = set(zipfile.ZipFile(built.wheel).namelist())
    for static in ("index.html", "app.js", "api.js", "dom.js", "console.css"):
        assert f"inferflux/api/console/static/{static}" in names


def test_the_installed_commands_answer(installed: Installed) -> None:
    assert run(installed, "inferflux", "--version").strip() == inferflux.__version__
    assert run(installed, "inferctl", "--version").strip() == inferflux.__version__
    assert "--grpc-port" in run(installed, "inferflux", "serve", "--help")
    assert "completion" in run(installed, "inferctl", "--help")
    where = run(
        installed,
        "python",
        "-c",
        "import inferflux, inferflux.api.grpc.gen.inference_pb2_grpc; print(inferflux.__file__)",
    )
    assert where.startswith(str(installed.bin.parent))  # the wheel's, not the source tree's


def test_the_installed_server_generates(
    installed: Installed, smollm2_model_path: str, tmp_path: Path
) -> None:
    server = ServerProcess(
        "--model",
        smollm2_model_path,
        "--model-id",
        "smol",
        executable=str(installed.bin / "inferflux"),
        cwd=installed.home,
        env={"PYTHONPATH": ""},
        log_path=tmp_path / "server.log",
    )
    try:
        server.wait_ready()
        reply = httpx.post(
            f"{server.url}/v1/completions",
            json={"model": "smol", "prompt": "The capital of France is", "max_tokens": 8},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0
        stats = httpx.get(f"{server.url}/server/stats", timeout=10).json()
        assert stats["version"] == inferflux.__version__
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert "inferflux_build_info{" in metrics
        assert f'version="{inferflux.__version__}"' in metrics
    finally:
        server.close()
